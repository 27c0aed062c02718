"""REST API: a job's assets, asset detail and download."""

from __future__ import annotations

import hashlib
import io
import logging

import pytest
from django.core.exceptions import ValidationError
from django.core.files.base import File

from jobstate import services
from jobstate.models import Asset
from tests.api_support import assert_error, client_for, grant, job_url, make_job, running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


def add_file(job, name: str = "report.csv", content: bytes = b"a,b\n1,2\n", **kw) -> Asset:  # type: ignore[no-untyped-def]
    return services.add_asset(job, asset_type="report", name=name, content=content, **kw)


def read(response) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(response.streaming_content)


def test_job_assets_in_the_order_produced(user):
    job = running(user)
    first = add_file(job, "a.txt", b"1")
    second = add_file(job, "b.txt", b"22")
    body = client_for(user).get(job_url(job, "assets/")).json()
    assert [a["id"] for a in body["results"]] == [str(first.pk), str(second.pk)]
    item = body["results"][1]
    assert (item["name"], item["size"], item["content_type"]) == ("b.txt", 2, "text/plain")
    assert item["sha256"] == hashlib.sha256(b"22").hexdigest()
    assert item["download_url"].endswith(f"/api/assets/{second.pk}/download/")
    assert item["url"] is None


def test_asset_list_and_detail_are_scoped(user, other_user, staff_user):
    mine = add_file(running(user))
    theirs = add_file(running(other_user))
    assert [a["id"] for a in client_for(user).get("/api/assets/").json()["results"]] == [str(mine.pk)]
    assert client_for(user).get(f"/api/assets/{mine.pk}/").json()["job"] == str(mine.job_id)
    assert_error(client_for(user).get(f"/api/assets/{theirs.pk}/"), 404, "not_found")
    assert client_for(staff_user).get("/api/assets/").json()["results"] == []  # staff status alone
    assert_error(client_for(staff_user).get(f"/api/assets/{theirs.pk}/download/"), 404, "not_found")
    viewer = grant(staff_user, "view_job")
    staff_ids = {a["id"] for a in client_for(viewer).get("/api/assets/").json()["results"]}
    assert staff_ids == {str(mine.pk), str(theirs.pk)}


def test_download_streams_the_file_with_type_length_and_safe_name(user):
    content = b"x" * 100_000
    asset = add_file(running(user), "../../etc/weird name;\r\n.csv", content)
    response = client_for(user).get(f"/api/assets/{asset.pk}/download/")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv"
    assert response["Content-Length"] == str(len(content))
    assert response["Content-Disposition"] == 'attachment; filename="weird_name.csv"'
    assert read(response) == content


def test_download_is_never_sniffed_nor_kept_by_a_shared_cache(user, settings):
    # Whatever the project's middleware: the API relied on SecurityMiddleware for
    # nosniff, and no download said private.
    settings.SECURE_CONTENT_TYPE_NOSNIFF = False
    asset = add_file(running(user), "page.html", b"<script>alert(1)</script>")
    response = client_for(user).get(f"/api/assets/{asset.pk}/download/")
    assert response.status_code == 200
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "private" in response["Cache-Control"]
    assert response["Content-Disposition"] == 'attachment; filename="page.html"'


def test_download_with_a_unicode_name(user):
    asset = add_file(running(user), "résumé.txt", b"hi")
    response = client_for(user).get(f"/api/assets/{asset.pk}/download/", HTTP_ACCEPT="application/pdf")
    assert response.status_code == 200
    assert response["Content-Disposition"] == "attachment; filename*=utf-8''r%C3%A9sum%C3%A9.txt"
    assert read(response) == b"hi"


@pytest.mark.parametrize(
    ("name", "safe"),
    [(".htaccess", "file.htaccess"), ("\U0001f600.txt", "file.txt"), ("-rf", "file-rf"), ("..", "file")],
)
def test_a_name_is_neither_hidden_nor_an_option(user, name, safe):
    asset = add_file(running(user), name, b"x")
    assert asset.name == safe
    assert asset.file.name.rsplit("/", 1)[1] == f"{asset.pk}_{safe}"  # neither hidden nor an option
    response = client_for(user).get(f"/api/assets/{asset.pk}/download/")
    assert response["Content-Disposition"] == f'attachment; filename="{safe}"'


def test_a_long_name_is_cut_to_what_a_file_system_stores(user):
    # 150 accented characters passed the 200-character cap as 300 bytes, over the
    # 255 bytes of a file name: "File name too long" in add_asset.
    asset = add_file(running(user), "\u00e9" * 150 + ".txt", b"x")
    assert asset.file.read() == b"x"
    assert asset.name == "\u00e9" * 98 + ".txt" and len(asset.name.encode()) == 200
    long = add_file(running(user), "\u00e9" * 150, b"y")
    assert long.name == "\u00e9" * 100


def test_a_long_ascii_name_keeps_its_extension(user):
    # It was cut to 200 characters before its extension was set aside: the
    # download's file name ended "aaa", not ".csv".
    asset = add_file(running(user), "a" * 300 + ".csv", b"x")
    assert asset.name == "a" * 196 + ".csv"
    response = client_for(user).get(f"/api/assets/{asset.pk}/download/")
    assert response["Content-Disposition"] == f'attachment; filename="{"a" * 196}.csv"'


def test_download_of_someone_elses_asset_is_a_404(user, other_user):
    asset = add_file(running(other_user))
    assert_error(client_for(user).get(f"/api/assets/{asset.pk}/download/"), 404, "not_found")


def test_external_assets_redirect(user):
    asset = services.add_asset(running(user), asset_type="link", url="https://files.example.com/out/x.png")
    response = client_for(user).get(f"/api/assets/{asset.pk}/download/")
    assert response.status_code == 302
    assert response["Location"] == "https://files.example.com/out/x.png"
    assert client_for(user).get(f"/api/assets/{asset.pk}/").json()["url"] == asset.url


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "data:text/html,<script>x</script>",
        "//evil.example/x",
        "https://",
        "ftp://h/x",
        "http://[x/",
    ],
)
def test_an_external_url_must_be_an_absolute_http_one(user, url):
    # The API hands `url` to clients, which may show it as a link: javascript: ran there.
    job = running(user)
    with pytest.raises(ValidationError) as caught:
        services.add_asset(job, asset_type="link", url=url)
    assert "url" in caught.value.message_dict
    assert not Asset.objects.filter(job=job).exists()


def test_an_external_url_may_name_any_host(user):
    asset = services.add_asset(running(user), asset_type="link", url="http://minio:9000/out/x.png")
    assert asset.url == "http://minio:9000/out/x.png"


def test_an_external_asset_with_an_unsafe_scheme_is_neither_shown_nor_followed(user):
    job = running(user)
    # A row stored before add_asset checked the scheme.
    asset = Asset.objects.create(job=job, owner=user, asset_type="link", name="x", url="javascript:alert(1)")
    assert client_for(user).get(f"/api/assets/{asset.pk}/").json()["url"] is None
    error = assert_error(client_for(user).get(f"/api/assets/{asset.pk}/download/"), 404, "not_found")
    assert "no stored file" in error["message"]


def test_a_file_missing_from_storage_is_a_404_not_a_500(user, media):
    asset = add_file(running(user))
    (media / asset.file.name).unlink()
    error = assert_error(client_for(user).get(f"/api/assets/{asset.pk}/download/"), 404, "not_found")
    assert "missing" in error["message"]


def _warnings(caplog, asset):  # type: ignore[no-untyped-def]
    return [
        r
        for r in caplog.records
        if r.name == "jobstate" and r.levelno == logging.WARNING and str(asset.pk) in r.getMessage()
    ]


@pytest.mark.parametrize("stored", ["../outside.csv", "jobstate/../../outside.csv", "/etc/passwd"])
def test_a_stored_file_name_outside_the_storage_is_a_404_not_a_500(user, caplog, stored):
    # A row an old version wrote, or a hand-edited one: the storage's SuspiciousFileOperation was a 500.
    asset = add_file(running(user))
    Asset.objects.filter(pk=asset.pk).update(file=stored)
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        response = client_for(user).get(f"/api/assets/{asset.pk}/download/")
    error = assert_error(response, 404, "not_found")
    assert error["message"] == "The asset's file cannot be served."
    assert len(_warnings(caplog, asset)) == 1


@pytest.mark.parametrize("content_type", ["text/csv\r\nSet-Cookie: a=b", "text/csv\n", "text/plain; é"])
def test_a_stored_content_type_no_header_can_carry_is_sent_as_octet_stream(user, caplog, content_type):
    # A line break in it was Django's BadHeaderError: a 500.
    asset = add_file(running(user))
    Asset.objects.filter(pk=asset.pk).update(content_type=content_type)
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        response = client_for(user).get(f"/api/assets/{asset.pk}/download/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/octet-stream" and "Set-Cookie" not in response
    assert read(response) == b"a,b\n1,2\n"
    assert len(_warnings(caplog, asset)) == 1


def test_assets_of_a_job_query_count(user, django_assert_num_queries):
    job = running(user)
    for i in range(5):
        add_file(job, f"f{i}.txt")
    client = client_for(user)
    with django_assert_num_queries(3):  # token + user, visibility, the page
        response = client.get(job_url(job, "assets/"))
    assert len(response.json()["results"]) == 5


def test_assets_of_a_job_without_any(user):
    job = make_job(user)
    assert client_for(user).get(job_url(job, "assets/")).json() == {
        "next": None,
        "previous": None,
        "results": [],
    }


def test_a_stored_url_that_does_not_parse_is_neither_shown_nor_followed(user):
    # urlsplit raises ValueError for it: the scheme check made a 500 of every
    # listing of the job's assets, and of the download.
    job = running(user)
    asset = Asset.objects.create(job=job, owner=user, asset_type="link", name="x", url="http://[x/")
    assert client_for(user).get(f"/api/assets/{asset.pk}/").json()["url"] is None
    assert client_for(user).get(f"/api/jobs/{job.pk}/assets/").status_code == 200
    assert_error(client_for(user).get(f"/api/assets/{asset.pk}/download/"), 404, "not_found")


# --- byte ranges (RFC 9110 section 14): resume a download, seek in a video ------------

DIGITS = bytes(range(256)) * 400  # 102,400 bytes, each position recognisable


def download(user, asset, method: str = "get", **headers):  # type: ignore[no-untyped-def]
    return getattr(client_for(user), method)(f"/api/assets/{asset.pk}/download/", **headers)


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [
        ("bytes=0-9", 0, 9),
        ("bytes=100000-", 100_000, 102_399),
        ("bytes=-5", 102_395, 102_399),
        ("bytes=102390-999999", 102_390, 102_399),  # a last past the end stops at the end
        ("bytes=-999999", 0, 102_399),  # a suffix longer than the file is all of it
        ("BYTES = 7-7 ,", 7, 7),  # the unit in any case, list whitespace and empty elements
        pytest.param("bytes=0-" + "9" * 5000, 0, 102_399, id="last-past-int-digits"),  # no 500
    ],
)
def test_a_range_is_answered_206_with_those_bytes_only(user, header, first, last):
    asset = add_file(running(user), "clip.mp4", DIGITS)
    response = download(user, asset, HTTP_RANGE=header)
    assert response.status_code == 206
    assert response["Content-Range"] == f"bytes {first}-{last}/{len(DIGITS)}"
    assert response["Content-Length"] == str(last - first + 1)
    assert read(response) == DIGITS[first : last + 1]
    assert response["Content-Type"] == "video/mp4"
    assert response["Content-Disposition"] == 'attachment; filename="clip.mp4"'
    assert response["X-Content-Type-Options"] == "nosniff" and "private" in response["Cache-Control"]
    assert response["Accept-Ranges"] == "bytes"


def test_a_range_is_not_handed_to_a_servers_file_wrapper(user, rf):
    # A WSGI server's wsgi.file_wrapper (sendfile) sends file_to_stream from its
    # position to the end: a range is read in blocks instead, up to its last byte.
    # (The test client rewraps every stream, so this asks the service itself.)
    asset = add_file(running(user), "clip.mp4", DIGITS)
    whole = services.file_response(asset, rf.get("/"))
    assert whole.file_to_stream is not None  # the whole file still may be
    whole.close()
    part = services.file_response(asset, rf.get("/", HTTP_RANGE="bytes=10-5009"))
    assert part.file_to_stream is None
    assert read(part) == DIGITS[10:5010]
    part.close()


def test_a_hosts_gzip_middleware_sends_files_as_stored(user, settings):
    # GZipMiddleware compresses streaming responses: a 206 went out gzipped under the
    # Content-Range of the file's own bytes (a corrupt resume), and a 200 lost its
    # Content-Length and had its ETag made weak, which no If-Range matches.
    from django.conf import settings as project

    settings.MIDDLEWARE = ["django.middleware.gzip.GZipMiddleware", *project.MIDDLEWARE]
    asset = add_file(running(user), "clip.csv", DIGITS)
    etag = f'"{asset.sha256}"'
    part = download(user, asset, HTTP_RANGE="bytes=100-5099", HTTP_ACCEPT_ENCODING="gzip, deflate")
    assert part.status_code == 206 and "Content-Encoding" not in part
    assert part["Content-Range"] == "bytes 100-5099/102400" and part["Content-Length"] == "5000"
    assert read(part) == DIGITS[100:5100]
    whole = download(user, asset, HTTP_ACCEPT_ENCODING="gzip")
    assert whole.status_code == 200 and "Content-Encoding" not in whole
    assert whole["ETag"] == etag and whole["Content-Length"] == "102400"
    assert read(whole) == DIGITS
    resumed = download(user, asset, HTTP_RANGE="bytes=5-", HTTP_IF_RANGE=etag, HTTP_ACCEPT_ENCODING="gzip")
    assert resumed.status_code == 206 and read(resumed) == DIGITS[5:]


def test_every_download_accepts_ranges_and_has_a_strong_etag(user):
    asset = add_file(running(user), "a.csv", b"a,b\n")
    response = download(user, asset)
    assert response.status_code == 200
    assert response["Accept-Ranges"] == "bytes"
    assert response["ETag"] == '"' + hashlib.sha256(b"a,b\n").hexdigest() + '"'
    assert "Content-Range" not in response


@pytest.mark.parametrize(
    "header",
    [
        "bytes=102400-",
        "bytes=999999-1000000",
        "bytes=-0",
        pytest.param("bytes=" + "9" * 5000 + "-", id="first-past-int-digits"),
    ],
)
def test_a_range_past_the_end_is_a_416_with_the_size(user, header):
    asset = add_file(running(user), "clip.mp4", DIGITS)
    response = download(user, asset, HTTP_RANGE=header)
    error = assert_error(response, 416, "range_not_satisfiable")
    assert response["Content-Range"] == "bytes */102400"
    assert "102400 bytes" in error["message"]


@pytest.mark.parametrize(
    "header",
    [
        "bytes=5-2",  # last before first
        "bytes=abc",
        "bytes=",
        "bytes 0-5",
        "bytes=--5",
        "bytes=1-2-3",
        "bytes=\u0661-\u0665",  # digits, but not ASCII ones
        "items=0-5",  # another unit
        "bytes=0-1,5-6",  # several ranges: no multipart/byteranges
        "bytes=-1,-2",
    ],
)
def test_an_invalid_range_another_unit_or_several_ranges_get_the_whole_file(user, header):
    asset = add_file(running(user), "clip.mp4", DIGITS)
    response = download(user, asset, HTTP_RANGE=header)
    assert response.status_code == 200
    assert "Content-Range" not in response
    assert response["Content-Length"] == str(len(DIGITS))
    assert read(response) == DIGITS


def test_if_range_sends_the_range_only_of_the_same_file(user):
    asset = add_file(running(user), "clip.mp4", DIGITS)
    etag = f'"{asset.sha256}"'
    same = download(user, asset, HTTP_RANGE="bytes=10-19", HTTP_IF_RANGE=etag)
    assert same.status_code == 206 and read(same) == DIGITS[10:20]
    for other in (f'"{"0" * 64}"', f"W/{etag}", "Sun, 29 Nov 2026 08:00:00 GMT", ""):
        whole = download(user, asset, HTTP_RANGE="bytes=10-19", HTTP_IF_RANGE=other)
        assert whole.status_code == 200 and read(whole) == DIGITS, other
    # Another version's range may lie past this one's end: the whole file, not a 416.
    changed = download(user, asset, HTTP_RANGE="bytes=999999-", HTTP_IF_RANGE=f'"{"0" * 64}"')
    assert changed.status_code == 200 and read(changed) == DIGITS


def test_a_file_without_a_checksum_has_no_etag_and_if_range_gets_it_whole(user, media):
    job = running(user)
    # A row stored otherwise than by add_asset, without a sha256.
    (media / "jobstate" / str(job.pk)).mkdir(parents=True)
    (media / "jobstate" / str(job.pk) / "old.bin").write_bytes(DIGITS)
    asset = Asset.objects.create(
        job=job, owner=user, asset_type="x", name="old.bin", file=f"jobstate/{job.pk}/old.bin"
    )
    assert "ETag" not in download(user, asset)
    assert read(download(user, asset, HTTP_RANGE="bytes=0-0")) == DIGITS[:1]
    whole = download(user, asset, HTTP_RANGE="bytes=0-0", HTTP_IF_RANGE='""')
    assert whole.status_code == 200 and read(whole) == DIGITS


def test_an_empty_file_has_no_byte_to_range_over(user):
    # RFC 9110 section 14.1.1: a suffix of an empty file is satisfiable, but a 206
    # cannot say "no bytes": the whole (empty) file; any first position is past the end.
    asset = add_file(running(user), "empty.txt", b"")
    for header in ("bytes=0-", "bytes=0-0", "bytes=-0"):
        response = download(user, asset, HTTP_RANGE=header)
        assert_error(response, 416, "range_not_satisfiable")
        assert response["Content-Range"] == "bytes */0", header
    whole = download(user, asset, HTTP_RANGE="bytes=-5")
    assert whole.status_code == 200 and whole["Content-Length"] == "0" and read(whole) == b""


def test_head_answers_as_get_without_the_body(user):
    asset = add_file(running(user), "clip.mp4", DIGITS)
    whole = download(user, asset, "head")
    assert whole.status_code == 200 and whole["Content-Length"] == str(len(DIGITS))
    assert whole["Accept-Ranges"] == "bytes" and whole["ETag"] == f'"{asset.sha256}"'
    part = download(user, asset, "head", HTTP_RANGE="bytes=-10")
    assert part.status_code == 206 and part["Content-Range"] == "bytes 102390-102399/102400"
    assert part["Content-Length"] == "10"
    past = download(user, asset, "head", HTTP_RANGE="bytes=102400-")
    assert past.status_code == 416 and past["Content-Range"] == "bytes */102400"


def test_head_reads_no_byte_of_the_file(user, rf):
    # The test client drops a HEAD's body itself; a server may not: nothing to send.
    asset = add_file(running(user), "clip.mp4", DIGITS)
    for headers in ({}, {"HTTP_RANGE": "bytes=0-99"}):
        response = services.file_response(asset, rf.head("/", **headers))
        assert response.file_to_stream is None
        assert read(response) == b""
        response.close()


def test_ranges_change_neither_redirects_nor_whose_files_are_served(user, other_user):
    link = services.add_asset(running(user), asset_type="link", url="https://files.example.com/x.mp4")
    redirect = download(user, link, HTTP_RANGE="bytes=0-9")
    assert redirect.status_code == 302 and redirect["Location"] == link.url
    theirs = add_file(running(other_user), "clip.mp4", DIGITS)
    for header in ("bytes=0-9", "bytes=999999-"):
        assert_error(download(user, theirs, HTTP_RANGE=header), 404, "not_found")


class Pipe:
    """A storage's stream that can only be read: no seek, no tell, no size."""

    closed = False

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._data.read(size)

    def close(self) -> None:
        pass


def test_a_file_that_cannot_tell_its_size_is_sent_whole(user, monkeypatch):
    asset = add_file(running(user), "clip.mp4", DIGITS)
    monkeypatch.setattr(asset.file.storage, "_open", lambda name, mode="rb": File(Pipe(DIGITS)))
    response = download(user, asset, HTTP_RANGE="bytes=0-9")
    assert response.status_code == 200
    assert response["Accept-Ranges"] == "none"
    assert read(response) == DIGITS


def test_a_file_that_fails_after_it_was_opened_is_closed(user, monkeypatch):
    # A storage's file that tells its size but fails to seek to a range's start (a
    # network stream, say): the 404 for a missing file, and the file closed, as on a 416.
    asset = add_file(running(user), "clip.mp4", DIGITS)
    opened: list[io.BytesIO] = []

    class NoSeekingForward(io.BytesIO):
        def seek(self, offset: int, whence: int = 0) -> int:
            if whence == 0 and offset > 0:
                raise OSError("the stream cannot seek")
            return super().seek(offset, whence)

    def open_stream(name: str, mode: str = "rb") -> File:  # type: ignore[type-arg]
        opened.append(NoSeekingForward(DIGITS))
        return File(opened[-1], name=name)

    monkeypatch.setattr(asset.file.storage, "_open", open_stream)
    error = assert_error(download(user, asset, HTTP_RANGE="bytes=10-"), 404, "not_found")
    assert "missing" in error["message"]
    assert len(opened) == 1 and opened[0].closed
