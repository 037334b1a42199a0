"""The task lists' search box (issue 19): ids and id prefixes, task path text, arguments,
keyword arguments and metadata as JSON values, dedup keys; refused terms; the optional
search indexes on PostgreSQL (``manage.py searchindex``) and the plan they give.
"""

from __future__ import annotations

import uuid
from io import StringIO
from urllib.parse import urlencode

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils.html import escape

from django_tasks_plus.db.search_index import SEARCH_INDEXES, present
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.search import BadSearch, Kind, Term, parse_search, split_terms
from django_tasks_plus.selection import BadFilter, with_search
from tests import tasks
from tests.conftest import postgres_only
from tests.test_admin_pages import dead_row
from tests.test_operator_input import admin_url

pytestmark = pytest.mark.django_db(transaction=True)


# -- the syntax (no database) ----------------------------------------------------------------


def test_each_kind_of_term_is_read():
    assert parse_search(
        '0F0E0D0C task:send arg:42 arg:"42" kwarg:user_id=7 meta:tenant="acme corp" '
        "dedup:digest:42 mail"
    ) == (
        Term(Kind.ID, "0f0e0d0c"),
        Term(Kind.TASK, "send"),
        Term(Kind.ARG, 42),
        Term(Kind.ARG, "42"),
        Term(Kind.KWARG, 7, key="user_id"),
        Term(Kind.META, "acme corp", key="tenant"),
        Term(Kind.DEDUP, "digest:42"),
        Term(Kind.TASK, "mail"),
    )


def test_values_are_json_so_types_are_never_guessed():
    (flag, number, nothing, nested) = parse_search(
        'meta:flag=true arg:1.5 kwarg:x=null meta:m={"a": [1, "b c"]}'
    )
    assert flag.value is True
    assert number.value == 1.5
    assert nothing.value is None
    assert nested.value == {"a": [1, "b c"]}
    assert split_terms('a  "b c"  x:{"k": [1, 2]} ') == ["a", '"b c"', 'x:{"k": [1, 2]}']


def test_whole_ids_and_short_ones_follow_the_short_id_rules():
    whole = uuid.uuid4()
    assert parse_search(str(whole)) == (Term(Kind.ID, whole.hex),)
    assert parse_search(f"urn:uuid:{whole}") == (Term(Kind.ID, whole.hex),)
    assert parse_search(f"id:{whole.hex[:10]}") == (Term(Kind.ID, whole.hex[:10]),)
    # Shorter than a short id: plain text is then part of a task path.
    assert parse_search("0f0e0d") == (Term(Kind.TASK, "0f0e0d"),)


BAD_TERMS = {
    "meta:tenant=acme": "'acme' is not a JSON value; write text in double quotes (\"acme\")",
    "arg:NaN": "'NaN' is not a JSON value",
    'meta:m={"a":1': "is not valid JSON; check its quotes, brackets and commas.",
    "kwarg:user_id": "write kwarg:NAME=VALUE",
    "meta:=1": "write meta:KEY=VALUE",
    "kwarg:x=": "give a JSON value after '='.",
    "arg:": "give a JSON value after the colon",
    "dedup:": "give the dedup key after the colon.",
    "owner:bob": "owner: is not a search term; use id:PREFIX",
    "id:0f0e0d": "'0f0e0d' is too short for a task id",
    "id:xyz12345": "'xyz12345' is not a task id",
    'task:"open': "a double quote is not closed.",
    " ".join(["mail"] * 11): "11 search terms: give at most 10.",
    "task:a\x00b": "A search term holds a NUL character",
    'arg:"\\u0000"': "A search term holds a NUL character",
    'meta:k={"\\u0000": 1}': "A search term holds a NUL character",
    'arg:"\\ud800"': "holds text that is not valid Unicode.",
    "arg:1e400": "the number is too large.",
    f"arg:{2**63}": "the number is beyond 64 bits",
    "arg:" + "[" * 21 + "]" * 21: "nested more than 20 deep.",
    "arg:" + "[" * 5000 + "]" * 5000: "nested more than 20 deep.",
}


@pytest.mark.parametrize("text", BAD_TERMS)
def test_a_term_that_cannot_be_read_is_refused_with_the_fix(text):
    with pytest.raises(BadSearch) as raised:
        parse_search(text)
    assert BAD_TERMS[text] in str(raised.value)
    assert isinstance(raised.value, BadFilter)  # the lists' 400 page shows it


# -- what each term finds, on the database the suite runs on ----------------------------------


def found(text: str) -> set[str]:
    rows = with_search(TaskRecord.objects.all(), parse_search(text))
    return {str(pk) for pk in rows.values_list("pk", flat=True)}


def with_metadata(task_id: str, metadata: dict[str, object]) -> str:
    TaskRecord.objects.filter(pk=task_id).update(metadata=metadata)
    return task_id


def test_each_term_finds_its_rows_and_no_others():
    a = tasks.echo.enqueue(42, "acme", user_id=7, flag=True).id
    b = tasks.echo.enqueue("42", 1.5, user_id="7", flag=False).id
    c = tasks.add.enqueue(1, 2).id
    with_metadata(a, {"tenant": "acme", "n": 3, "tags": ["x"]})
    with_metadata(b, {"tenant": "acme corp", "n": 3.0})
    assert found("arg:42") == {a}
    assert found('arg:"42"') == {b}
    assert found('arg:"acme"') == {a}
    assert found("arg:1.5") == {b}
    assert found("arg:1") == {c}
    assert found("kwarg:user_id=7") == {a}
    assert found('kwarg:user_id="7"') == {b}
    assert found("kwarg:flag=true") == {a}
    assert found("kwarg:flag=false") == {b}
    assert found("kwarg:flag=1") == set()  # true is not the number 1
    assert found('meta:tenant="acme"') == {a}
    assert found('meta:tenant="acme corp"') == {b}
    assert found("meta:n=3") == {a, b}  # 3 and 3.0 are one JSON number
    assert found('meta:tags=["x"]') == {a}
    assert found('meta:missing="acme"') == set()
    assert found("echo") == {a, b}
    assert found("task:tests.tasks.add") == {c}
    assert found(f"{str(a)[:8]} arg:42") == {a}
    assert found(f'{b} meta:tenant="acme"') == set()  # every term must match


def test_a_tagged_argument_is_found_by_its_stored_form():
    wanted = uuid.uuid4()
    task = tasks.echo.enqueue(wanted).id
    tasks.echo.enqueue(str(wanted))
    assert found(f'arg:{{"__dtp__": "uuid", "v": "{wanted}"}}') == {task}


def test_dedup_search_finds_the_tasks_holding_the_key():
    held = tasks.add.using(dedup_key="digest:42").enqueue(1, 1).id
    other = tasks.add.using(dedup_key="digest:4").enqueue(1, 1).id
    tasks.add.enqueue(1, 1)
    assert found("dedup:digest:42") == {held}
    assert found('dedup:"digest:4"') == {other}
    assert found("dedup:digest") == set()  # the whole key, not a part of it


# -- the admin's lists ------------------------------------------------------------------------


def listed(admin_client, page: str, text: str) -> tuple[int, str]:
    response = admin_client.get(admin_url(page) + "?" + urlencode({"q": text}))
    return response.status_code, response.content.decode()


def test_the_task_list_searches_arguments_and_metadata(admin_client):
    wanted = tasks.echo.enqueue(user_id=42).id
    other = tasks.echo.enqueue(user_id=43).id
    with_metadata(wanted, {"tenant": "acme"})
    for text in ("kwarg:user_id=42", 'meta:tenant="acme"'):
        status, page = listed(admin_client, "taskrecord_changelist", text)
        assert status == 200
        assert f'title="{wanted}"' in page
        assert f'title="{other}"' not in page


def test_the_dead_letters_search_their_arguments(admin_client):
    boom, bang = dead_row(args=["boom"]), dead_row(args=["bang"])
    status, page = listed(admin_client, "taskrecord_deadletters", 'arg:"bang"')
    assert status == 200
    assert f'title="{bang.pk}"' in page
    assert f'title="{boom.pk}"' not in page


def test_an_ambiguous_id_prefix_lists_every_candidate(admin_client):
    first = tasks.echo.enqueue().id
    second = tasks.echo.enqueue().id
    third = tasks.echo.enqueue().id
    TaskRecord.objects.filter(pk=first).update(id=uuid.UUID("abcdef12-0000-4000-8000-000000000001"))
    TaskRecord.objects.filter(pk=second).update(
        id=uuid.UUID("abcdef12-0000-4000-8000-00000000002a")
    )
    status, page = listed(admin_client, "taskrecord_changelist", "abcdef12")
    assert status == 200
    assert 'title="abcdef12-0000-4000-8000-000000000001"' in page
    assert 'title="abcdef12-0000-4000-8000-00000000002a"' in page
    assert f'title="{third}"' not in page
    status, page = listed(
        admin_client, "taskrecord_changelist", "abcdef12-0000-4000-8000-00000000002"
    )
    assert 'title="abcdef12-0000-4000-8000-00000000002a"' in page
    assert 'title="abcdef12-0000-4000-8000-000000000001"' not in page


@pytest.mark.parametrize("page", ["taskrecord_changelist", "taskrecord_deadletters"])
def test_a_bad_search_is_the_lists_400_page_never_every_row(admin_client, page):
    dead = dead_row()
    status, text = listed(admin_client, page, "meta:tenant=acme")
    assert status == 400
    assert escape("q: meta:tenant=acme: 'acme' is not a JSON value") in text
    assert f'title="{dead.pk}"' not in text
    status, text = listed(admin_client, page, "owner:bob")
    assert status == 400
    assert escape("owner: is not a search term") in text
    # Values no database could store answer the same page, never a database error (500).
    for bad in ("task:a\x00b", 'arg:"\\u0000"', 'arg:"\\udfff"', f"arg:{2**64}", "arg:1e999"):
        assert listed(admin_client, page, bad)[0] == 400, bad


def test_all_matching_acts_on_what_the_search_finds(admin_client):
    wanted, other = dead_row(args=["bang"]), dead_row(args=["boom"])
    url = admin_url("taskrecord_matching", "redrive") + "?" + urlencode({"q": 'arg:"bang"'})
    assert "Redrive <strong>1</strong>" in admin_client.get(url).content.decode()
    admin_client.post(url)
    assert TaskRecord.objects.get(pk=wanted.pk).status == "READY"
    assert TaskRecord.objects.get(pk=other.pk).status == "FAILED"


# -- SQLite's fallback ------------------------------------------------------------------------


def test_sqlite_matches_an_object_value_whole():
    """No containment on SQLite: an object or array value must equal the stored one."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL matches by containment (the next tests)")
    task = with_metadata(tasks.echo.enqueue().id, {"trace": {"id": "t1", "sampled": True}})
    assert found('meta:trace={"id": "t1", "sampled": true}') == {task}
    assert found('meta:trace={"id": "t1"}') == set()


# -- PostgreSQL: containment and the optional indexes -----------------------------------------


def searchindex(*args: str) -> str:
    out = StringIO()
    call_command("searchindex", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def no_search_indexes():
    yield
    if connection.vendor == "postgresql":
        searchindex("drop")


@postgres_only
def test_postgresql_matches_a_nested_value_by_containment():
    task = with_metadata(tasks.echo.enqueue().id, {"trace": {"id": "t1", "sampled": True}})
    assert found('meta:trace={"id": "t1"}') == {task}
    assert found('meta:trace={"id": "t2"}') == set()


@postgres_only
def test_searchindex_creates_and_drops_the_indexes_concurrently(no_search_indexes):
    names = [index.name for index in SEARCH_INDEXES]
    assert present(connection) == dict.fromkeys(names, False)
    out = searchindex("create")
    assert f"Built {', '.join(names)}." in out
    assert present(connection) == dict.fromkeys(names, True)
    assert "All present." in searchindex("create")
    assert "dtp_task_args_gin: present" in searchindex()
    assert f"Dropped {', '.join(names)}." in searchindex("drop")
    assert present(connection) == dict.fromkeys(names, False)


def test_searchindex_on_sqlite_says_it_has_no_such_index():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    with pytest.raises(CommandError, match="only PostgreSQL has"):
        searchindex("create")


def _plan(text: str) -> str:
    rows = with_search(TaskRecord.objects.filter(backend_name="default"), parse_search(text))
    return rows.order_by("-enqueued_at", "-id")[:50].explain()


@postgres_only
def test_the_json_search_walks_the_search_indexes(no_search_indexes):
    """20,000 tasks, a handful with the searched values: with the indexes the plan reads
    them (a bitmap scan of the GIN index), where without them it reads the table."""
    tasks.add.enqueue_many([((n, n), {}) for n in range(20_000)])
    tenant = tasks.echo.enqueue(user_id=-1).id
    with_metadata(tenant, {"tenant": "acme"})
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")
    assert "_gin" not in _plan("arg:12345")
    searchindex("create")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")
    for text, index in (
        ("arg:12345", "dtp_task_args_gin"),
        ("kwarg:user_id=-1", "dtp_task_kwargs_gin"),
        ('meta:tenant="acme"', "dtp_task_metadata_gin"),
    ):
        plan = _plan(text)
        assert index in plan, plan
        assert f"Seq Scan on {table}" not in plan, plan
    assert len(found("arg:12345")) == 1
    assert found("kwarg:user_id=-1") == found('meta:tenant="acme"') == {tenant}
