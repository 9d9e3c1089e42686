"""The worker's one memory budget (issue 40, item 1): a need past the whole budget is refused before any work,
needs within it wait their turn, and the chunk answers kept count against the same bytes and give way to work.

In process, with the real budget, answer cache and a local store (milliseconds)."""

from pathlib import Path

import anyio
import pytest

from gateway.http.answers import AnswerCache, AnswerKey
from gateway.http.budget import MemoryBudget, OverBudget
from gateway.resources import OCTET_STREAM, FileVersions, Resource, bytes_resource
from gateway_storage import LocalStore

LIMIT = 64 << 10


def _answer(store: LocalStore, path: Path, size: int) -> tuple[AnswerKey, Resource]:
    path.write_bytes(b"x")
    versions = FileVersions(store, ((str(path), store.identity(str(path))),))
    return AnswerKey("zarr", ("o", "d", "l", path.name), "made-as", (0,)), bytes_resource(
        bytes(size), OCTET_STREAM, made_from=versions
    )


def test_a_need_past_the_whole_budget_is_refused_with_the_reason() -> None:
    budget = MemoryBudget(LIMIT)

    async def main() -> None:
        with pytest.raises(OverBudget, match="chunk_memory_bytes"):
            async with budget.hold(LIMIT + 1):
                raise AssertionError("work ran past the budget")
        async with budget.hold(LIMIT):
            assert budget.used == LIMIT
        assert budget.used == 0

    anyio.run(main)


def test_needs_within_the_budget_wait_their_turn() -> None:
    budget = MemoryBudget(LIMIT)
    most = 0

    async def one() -> None:
        nonlocal most
        async with budget.hold(LIMIT // 2 + 1):
            most = max(most, budget.used)
            await anyio.sleep(0.01)

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            for _ in range(4):
                tasks.start_soon(one)

    anyio.run(main)
    assert most == LIMIT // 2 + 1 and budget.used == 0


def test_kept_answers_count_against_the_budget_and_give_way_to_work(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    budget = MemoryBudget(LIMIT)
    answers = AnswerCache(16 * LIMIT, budget)  # its own bound is far larger: the budget is what holds it
    for n in range(8):
        key, answer = _answer(store, tmp_path / f"f{n}", LIMIT // 8)
        answers.keep(key, answer)
    assert 0 < answers.size_bytes <= LIMIT  # the least recently used gave way to the last ones

    async def main() -> None:
        async with budget.hold(LIMIT // 2):
            assert budget.used + answers.size_bytes <= LIMIT  # the least recently used gave way
            key, answer = _answer(store, tmp_path / "late", LIMIT // 2)
            answers.keep(key, answer)
            assert budget.used + answers.size_bytes <= LIMIT  # no room beside the work in flight

    anyio.run(main)
