"""Issue 42: every page names an icon, a static file (no inline data: the CSP), and the
conventional /favicon.ico (asked for by pages that name none: the admin's) leads to it, so no
page logs a 404 for it."""

from __future__ import annotations

import re

from django.contrib.staticfiles import finders


def test_pages_name_a_static_favicon_and_the_conventional_path_leads_to_it(client, ordinary_user):
    client.force_login(ordinary_user)

    page = client.get("/jobs/").content.decode()
    [icon] = re.findall(r'<link rel="icon" href="([^"]+)"', page)
    redirect = client.get("/favicon.ico")

    assert icon == "/static/favicon.svg" and finders.find("favicon.svg")
    assert redirect.status_code == 301 and redirect["Location"] == icon
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
