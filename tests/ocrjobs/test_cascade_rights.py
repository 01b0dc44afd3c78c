"""The cascade checks the same rights as a submission (issue 38, N5): a page is escalated only into
a pool its job's owner may submit to (else it keeps its first reading, saying why), and a pool may
not escalate to one less open than itself."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError

from ocrjobs.models import Page
from ocrjobs.services.escalation_budget import NOT_OPEN
from ocrjobs.services.pages import pages_claim
from pods.models import Pool
from tests.ocrjobs.test_cascade import _job, _read


def _kept_first(page: Page) -> dict:
    page.refresh_from_db()
    assert page.status == Page.Status.DONE and page.escalated_from_id is None
    return page.read_result()


def test_an_ordinary_users_page_is_not_escalated_into_a_staff_only_pool(cascade, ordinary_user, admin_user):
    cheap, strong = cascade
    Pool.objects.filter(pk=strong.pk).update(staff_only=True)  # as the review did: past Pool.clean
    mine, staffs = _job(ordinary_user, cheap, pages=2), _job(admin_user, cheap, pages=2)

    _read(cheap, [40, 40, 40, 40], engine="tesseract")

    for page in mine.pages.all():
        result = _kept_first(page)
        assert result["escalated"] is False and result["cascade"][1] == {"pool": "strong", "skipped": NOT_OPEN}
    assert {page.pool_id for page in staffs.pages.all()} == {strong.pk}  # staff may use it: escalated
    assert len(pages_claim(pool_id=strong.pk, token="t", limit=10)) == staffs.pages.count()


def test_a_page_escalates_into_a_group_pool_only_for_the_groups_members(cascade, ordinary_user, outsider):
    cheap, strong = cascade
    team = Group.objects.create(name="archive team")
    strong.groups.add(team)
    ordinary_user.groups.add(team)
    member, other = _job(ordinary_user, cheap, pages=2), _job(outsider, cheap, pages=2)

    _read(cheap, [40, 40, 40, 40], engine="tesseract")

    assert {page.pool_id for page in member.pages.all()} == {strong.pk}
    assert all(_kept_first(page)["cascade"][1]["skipped"] == NOT_OPEN for page in other.pages.all())


def test_a_pool_cannot_escalate_to_one_less_open_than_itself(cascade):
    cheap, strong = cascade
    Pool.objects.filter(pk=strong.pk).update(staff_only=True)
    cheap.refresh_from_db()
    with pytest.raises(ValidationError, match="kept to staff"):
        cheap.full_clean()

    Pool.objects.filter(pk=strong.pk).update(staff_only=False)
    strong.groups.add(Group.objects.create(name="gpu users"))
    cheap.refresh_from_db()
    with pytest.raises(ValidationError, match="kept to groups"):
        cheap.full_clean()

    Pool.objects.filter(pk=cheap.pk).update(staff_only=True)  # a staff-only source may escalate anywhere
    cheap.refresh_from_db()
    cheap.full_clean()


def test_the_admin_refuses_an_escalation_pool_less_open_than_the_groups_being_saved(client, admin_user, cascade):
    cheap, strong = cascade
    team, others = Group.objects.create(name="team"), Group.objects.create(name="others")
    strong.groups.add(team)
    client.force_login(admin_user)
    page = client.get(f"/admin/pods/pool/{cheap.pk}/change/")
    form = page.context["adminform"].form
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data.update(escalation_pool=strong.pk, escalation_threshold=80, groups=[others.pk], config="{}")

    refused = client.post(f"/admin/pods/pool/{cheap.pk}/change/", data)
    data["groups"] = [team.pk]
    accepted = client.post(f"/admin/pods/pool/{cheap.pk}/change/", data)

    assert refused.status_code == 200 and "kept to groups" in refused.content.decode()
    assert accepted.status_code == 302, accepted.content.decode()[:2000]
    assert list(cheap.groups.values_list("name", flat=True)) == ["team"]
