#!/usr/bin/env bash
# Wall time and machine-wide busy CPU seconds (all processes, from /proc/stat) of one command:
# for commands whose processes (JVMs, bookies, Spark workers) are not all its children.
# Run it on an otherwise idle machine.   bench/cpu_of.sh CMD [ARGS...]
set -u
read -r _ u n s _ _ irq sirq _ < /proc/stat
busy0=$((u + n + s + irq + sirq)); t0=$(date +%s.%N)
"$@"
rc=$?
read -r _ u n s _ _ irq sirq _ < /proc/stat
busy1=$((u + n + s + irq + sirq)); t1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
python3 -c "print(f'wall {$t1 - $t0:.1f}s, busy CPU {($busy1 - $busy0) / $hz:.1f}s, exit $rc')"
exit $rc
