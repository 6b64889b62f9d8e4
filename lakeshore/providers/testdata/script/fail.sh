#!/bin/bash
# Fails every call: a long stderr (more than the 4 KiB the provider keeps),
# its last line the reason, and exit status 3.
for i in $(seq 1 200); do
	echo "noise line $i: the cloud CLI is chatty before it fails"
done >&2
echo "InsufficientCapacity: no machines of that type in this zone" >&2
exit 3
