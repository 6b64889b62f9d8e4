#!/bin/bash
# Never answers. When $LAUNCHER_STATE/fifo exists it first starts a child
# that writes "started" into that FIFO and then holds it open: the reader
# sees the end of the FIFO only once that child (not just this script) is
# dead.
if [[ -n ${LAUNCHER_STATE:-} && -p $LAUNCHER_STATE/fifo ]]; then
	(
		echo started
		exec sleep 100000
	) >"$LAUNCHER_STATE/fifo" &
fi
exec sleep 100000
