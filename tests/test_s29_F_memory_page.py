"""The memory page, over real HTTP and the real Redis:

- a signed-in page offers "Sign out" (the route was there, but no page posted to it, though
  the README says signing out ends the link and its sessions), and pressing it ends the session;
- a sign-in link whose token holds a non-ASCII character gets the invalid-link page (it was a
  bare 500: the signature's comparison takes no non-ASCII text).
"""

from __future__ import annotations

import re

import pytest

from adapters.memory_page.auth import InvalidLink, LinkSigner
from adapters.memory_page.viewer import Viewer
from memory.scope import PUBLIC
from tests.test_memory_access import People, page_client
from tests.test_memory_page import signed_in, world  # noqa: F401 (a fixture)

SIGN_OUT = re.compile(
    r'<form[^>]*method="post" action="/memory/logout"><input type="hidden" name="csrf" '
    r'value="([^"]+)"><button>Sign out</button></form>'
)


async def test_a_signed_in_page_signs_out(memory, world):  # noqa: F811
    async with signed_in(memory, world.tenant, "U1") as client:
        response = await client.get("/memory")
        form = SIGN_OUT.search(await response.text())
        assert response.status == 200 and form, "no Sign out form on the page"
        response = await client.post("/memory/logout", data={"csrf": form.group(1)})
        assert response.status == 200 and "Signed out" in await response.text()
        assert (await client.get("/memory", allow_redirects=False)).status == 401


def test_a_token_with_a_non_ascii_character_is_an_invalid_link():
    signer = LinkSigner("test-secret")
    version, payload, signature = signer.sign("T1", "U1", "slack").split(".")
    for bad in (f"{version}.{payload}.{signature[:-1]}é", f"{version}.{payload}é.{signature}"):
        with pytest.raises(InvalidLink) as refused:
            signer.verify(bad)
        assert refused.value.reason == "invalid", bad


async def test_the_page_of_a_non_ascii_link_says_it_is_not_valid(memory, tenant):
    people = People()
    people.known["U1"] = Viewer(tenant, "U1", "slack", False, frozenset({PUBLIC}))
    async with page_client(memory, people) as (client, links, _):
        token = links.signer.sign(tenant, "U1", "slack")
        response = await client.get("/memory/login", params={"token": token[:-1] + "é"})
        assert response.status == 403 and "not valid" in await response.text()
