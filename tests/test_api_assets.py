"""REST API: a job's assets, asset detail and download."""

from __future__ import annotations

import hashlib

import pytest
from django.core.exceptions import ValidationError

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
    assert asset.file.name.rsplit("/", 1)[1] == safe
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
