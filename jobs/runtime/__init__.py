"""What every command process needs: one-line error messages, logging, progress bars, and
keeping pandas out of processes that do not need it."""
