TOKEN=...   # printed by drf_create_token
curl -s -X POST http://127.0.0.1:8000/api/jobs/ -H "Authorization: Token $TOKEN" \
     -H "Content-Type: application/json" -d '{"kind": "reports.build", "parameters": {"month": "2026-10"}}'
# 201 Created: {"id": "4ba13a05-…", "kind": "reports.build", "status": "queued", "progress": 0, …}
curl -s http://127.0.0.1:8000/api/jobs/4ba13a05-…/ -H "Authorization: Token $TOKEN"          # status, progress, result
curl -s http://127.0.0.1:8000/api/jobs/4ba13a05-…/assets/ -H "Authorization: Token $TOKEN"   # -> download_url
curl -s -OJ http://127.0.0.1:8000/api/assets/9c1e07d2-…/download/ -H "Authorization: Token $TOKEN"   # that download_url: saves report-2026-10.csv
