#!/bin/bash
# Exits 0 with malformed answers: launch gives a number for "instance_id",
# console-log gives text that is not JSON, terminate gives a JSON array.
cat >/dev/null
case ${1:-} in
launch) echo '{"instance_id": 42}' ;;
console-log) echo '<html>503 Service Unavailable</html>' ;;
terminate) echo '[]' ;;
esac
