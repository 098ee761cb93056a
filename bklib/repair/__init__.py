"""Re-replication: planning (pure, :mod:`.plan`) and per-ledger repair (:mod:`.worker`)."""
