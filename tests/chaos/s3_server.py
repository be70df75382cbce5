"""dev/s3.py's LocalS3 and FaultProxy in a process of their own, driven by one command per stdin line.

The chaos tests read the S3 tables with deltalake in the test process, and deltalake holds the GIL
while it waits for storage: a moto server in that same process could then never answer. Here the
server keeps its objects in this process's memory across ``stop``/``start`` (a restarted endpoint).

    python -m tests.chaos.s3_server BUCKET
    → one JSON line: {"endpoint": …, "proxy": …, "options": {…}}
    ← stop | start | fail | heal | quit   → one JSON line each: {"done": cmd, "faults": n}
"""

from __future__ import annotations

import json
import logging
import sys

from dev import s3


def main() -> int:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = s3.LocalS3()
    server.start()
    server.create_bucket(sys.argv[1])
    proxy = s3.FaultProxy(server.port)
    print(json.dumps({"endpoint": server.endpoint, "proxy": proxy.endpoint, "options": server.storage_options()}))
    sys.stdout.flush()
    actions = {"stop": server.stop, "start": server.start, "fail": proxy.fail, "heal": proxy.heal}
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        actions[command]()
        print(json.dumps({"done": command, "faults": proxy.faults}))
        sys.stdout.flush()
    proxy.close()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
