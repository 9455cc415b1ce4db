"""/docs and /redoc work offline (issue 17, item 16): their pages reference only this server's own
files, and those files are served (behind the token like every other non-health route)."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_pages_use_local_assets(asgi_server, page):
    async with asgi_server() as c:
        r = await c.get(page)
        assert r.status_code == 200
        urls = re.findall(r'(?:src|href)="([^"]+)"', r.text) + re.findall(r"url: '([^']+)'", r.text)
        assert urls and not [u for u in urls if u.startswith(("http:", "https:", "//"))], urls
        for u in urls:
            if u.startswith("/static-docs/"):
                a = await c.get(u)
                assert a.status_code == 200 and len(a.content) > 1000, u


async def test_docs_need_the_token(asgi_server):
    async with asgi_server(token="tok") as c:
        assert (await c.get("/docs")).status_code == 401
        assert (await c.get("/static-docs/swagger-ui.css")).status_code == 401
        assert (await c.get("/docs", headers={"authorization": "Bearer tok"})).status_code == 200
