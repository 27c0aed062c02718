"""The new-project test's user: the REST API with a token, the schema, the admin.

Run by tests/newproject/run.sh with the new project's own Python (standard library
only): ``check.py BASE_URL TOKEN ADMIN_USER ADMIN_PASSWORD``.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

BASE, TOKEN, USER, PASSWORD = sys.argv[1:5]
AUTH = {"Authorization": f"Token {TOKEN}"}


def request(
    method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, opener: Any = None
) -> tuple[int, dict[str, str], bytes]:
    data = None
    headers = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(BASE + path, data=data, headers=headers, method=method)
    try:
        with (opener or urllib.request.build_opener()).open(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def expect(status: int, wanted: int, what: str, body: bytes) -> None:
    if status != wanted:
        sys.exit(f"FAILED {what}: HTTP {status}, expected {wanted}: {body[:600]!r}")
    print(f"ok   {what} ({status})")


def wait_for_server() -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(BASE + "/admin/login/", timeout=5).read()
            return
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                sys.exit("FAILED the web server did not answer within 60 s")
            time.sleep(0.3)


def main() -> None:
    wait_for_server()

    # Enqueue over the API with the token.
    status, _, body = request(
        "POST", "/api/jobs/", {"kind": "reports.build", "parameters": {"month": "2026-10"}}, AUTH
    )
    expect(status, 201, "POST /api/jobs/ with a token enqueues the job", body)
    job = json.loads(body)
    job_id = job["id"]
    assert job["status"] == "queued", job

    # The worker cluster runs it to completion, with its progress and result.
    deadline = time.monotonic() + 90
    while True:
        status, _, body = request("GET", f"/api/jobs/{job_id}/", headers=AUTH)
        if status != 200:
            expect(status, 200, "GET /api/jobs/<id>/", body)
        job = json.loads(body)
        if job["status"] not in ("queued", "processing"):
            break
        if time.monotonic() > deadline:
            sys.exit(f"FAILED the job did not finish within 90 s: {job}")
        time.sleep(0.5)
    if job["status"] != "completed" or job["progress"] != 100 or job["result"] != {"rows": 1000}:
        sys.exit(f"FAILED the job did not complete as the handler says: {job}")
    print(f"ok   the job completed: progress {job['progress']}, {job['progress_message']!r}, {job['result']}")

    # Its asset: listed, and the file downloads with the handler's content.
    status, _, body = request("GET", f"/api/jobs/{job_id}/assets/", headers=AUTH)
    expect(status, 200, "GET /api/jobs/<id>/assets/", body)
    assets = json.loads(body)
    assets = assets.get("results", assets) if isinstance(assets, dict) else assets
    if [a["name"] for a in assets] != ["report-2026-10.csv"]:
        sys.exit(f"FAILED expected one asset report-2026-10.csv: {assets}")
    url = urllib.parse.urlsplit(assets[0]["download_url"])
    status, _, body = request("GET", url.path, headers=AUTH)
    expect(status, 200, "the asset downloads", body)
    lines = body.decode().splitlines()
    if lines[0] != "month,row,value" or len(lines) != 1001:
        sys.exit(f"FAILED the asset is not the handler's CSV: {lines[:3]} ({len(lines)} lines)")
    print(f"ok   the asset is the handler's file ({len(body)} bytes)")

    # The OpenAPI schema.
    status, _, body = request("GET", "/api/schema/", headers={"Accept": "application/json"})
    expect(status, 200, "GET /api/schema/", body)
    if b"/api/jobs/" not in body or b"openapi" not in body:
        sys.exit(f"FAILED the schema does not describe the jobs API: {body[:300]!r}")

    # The admin: log in, open the job's page.
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    status, _, body = request("GET", "/admin/login/", opener=opener)
    expect(status, 200, "GET /admin/login/", body)
    csrf = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', body)
    assert csrf, "no CSRF token on the login page"
    form = urllib.parse.urlencode(
        {
            "username": USER,
            "password": PASSWORD,
            "csrfmiddlewaretoken": csrf.group(1).decode(),
            "next": "/admin/",
        }
    ).encode()
    req = urllib.request.Request(
        BASE + "/admin/login/",
        data=form,
        headers={"Content-Type": "application/x-www-form-urlencoded", "Referer": BASE + "/admin/login/"},
    )
    with opener.open(req, timeout=30) as resp:
        if "/admin/login/" in resp.geturl():
            sys.exit("FAILED the admin login was refused")
    status, _, body = request("GET", f"/admin/jobstate/job/{job_id}/change/", opener=opener)
    expect(status, 200, "the admin job page", body)
    page = body.decode()
    if job_id[-8:] not in page or "reports.build" not in page or "report-2026-10.csv" not in page:
        sys.exit("FAILED the admin job page does not show the job, its kind and its asset")
    print("ok   the admin job page shows the job, its kind and its asset")


if __name__ == "__main__":
    main()
