"""Exit 0 when a PostgreSQL server answers at the URL given (or DATABASE_URL)."""

import os
import sys

url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DATABASE_URL", "")
try:
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), connect_timeout=3) as conn:
        conn.execute("SELECT 1")
except Exception as exc:
    print(f"PostgreSQL not reachable: {exc}", file=sys.stderr)
    sys.exit(1)
