#!/usr/bin/env python3
"""Container health check: GET http://127.0.0.1:$K2D_METRICS__PORT/healthz, exit 0 on HTTP 200, else 1.

install-daemon.sh installs this as PREFIX/bin/kafka2delta-healthcheck with the venv's interpreter in the
shebang. Standard library only: the slim image has neither curl nor wget.
"""

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("K2D_METRICS__PORT", "")
    if not port or port == "0":
        print("kafka2delta-healthcheck: K2D_METRICS__PORT is not set (metrics are off)", file=sys.stderr)
        return 1
    path = sys.argv[1] if len(sys.argv) > 1 else "/healthz"
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=float(os.environ.get("K2D_HEALTHCHECK_TIMEOUT_S", "4"))) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"kafka2delta-healthcheck: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"kafka2delta-healthcheck: {url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
