"""Files rewritten in place while clients read them: the writer process, the readers, and the wait for what
the gateway serves once the writer has stopped (shared by the tests of the settle rule)."""

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from .processes import wait_until

WAIT_SECONDS = 60  # bound of every wait for the gateway to see a change (never a measured time)

# A writer that rewrites a file in place (same inode, same size, no truncation), alternating two
# versions, each burst ending on the version asked for. Most rewrites are one write call for the
# whole file: the call stamps mtime once, before it copies, so a read between the stamp and the copy
# reaching its block sees old bytes under the new version's size, mtime and inode. Every fourth goes
# block by block. A short pause after each rewrite lets readers see each version's stamp a while.
WRITER = r"""
import os, sys, time
target, block_bytes, *versions = sys.argv[1:]
step = int(block_bytes)
contents = [open(path, "rb").read() for path in versions]
for line in sys.stdin:
    count, final = map(int, line.split())
    fd = os.open(target, os.O_WRONLY)
    try:
        for turn in range(count):
            body = contents[(final + count - 1 - turn) % 2]
            if turn % 4:
                os.pwrite(fd, body, 0)
            else:
                for offset in range(0, len(body), step):
                    os.pwrite(fd, body[offset : offset + step], offset)
            time.sleep(0.01)
    finally:
        os.close(fd)
    print("done", flush=True)
"""


@dataclass
class Answer:
    server: str
    key: str
    status: int
    etag: str | None
    body: bytes
    retry_after: str | None


def hammer(name: str, base: str, keys: list[str], stop: threading.Event, answers: list[Answer]) -> None:
    """GET ``base/key`` for each of ``keys`` in turn until ``stop`` is set, noting every answer."""
    with requests.Session() as session:
        turn = 0
        while not stop.is_set():
            key = keys[turn % len(keys)]
            turn += 1
            response = session.get(f"{base}/{key}", timeout=30)
            etag, retry_after = response.headers.get("ETag"), response.headers.get("Retry-After")
            answers.append(Answer(name, key, response.status_code, etag, response.content, retry_after))


@contextmanager
def hammering(targets: dict[str, tuple[str, list[str]]]) -> Iterator[list[Answer]]:
    """One reader thread per target (name: base URL and keys) for as long as the block runs; the answers."""
    answers: list[Answer] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=hammer, args=(name, base, keys, stop, answers))
        for name, (base, keys) in targets.items()
    ]
    for thread in threads:
        thread.start()
    try:
        yield answers
    finally:
        stop.set()
        for thread in threads:
            thread.join()


class InPlaceWriter:
    """A process that rewrites ``target`` in place with the bytes of ``versions`` (two files of its size), in
    steps of ``step`` bytes when it goes piece by piece (see ``WRITER``)."""

    def __init__(self, target: Path, step: int, versions: list[Path]) -> None:
        self.target = target
        self.process = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target), str(step), *map(str, versions)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def burst(self, count: int, final: int) -> None:
        """``count`` rewrites, the last of them to version ``final``; returns once they are written."""
        self.start_burst(count, final)
        self.wait_for_burst()

    def start_burst(self, count: int, final: int) -> None:
        """Start ``count`` rewrites, the last of them to version ``final`` (others may write meanwhile)."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{count} {final}\n")
        self.process.stdin.flush()

    def wait_for_burst(self) -> None:
        """Return once the burst started last is written."""
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "done"

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()


def assert_each_body_is_one_version(answers: list[Answer], versions_of: Callable[[Answer], list[int]]) -> None:
    """Every answer read while files were rewritten is a 200 whose body is exactly one version of its chunk
    (``versions_of`` says which it matches) under an ETag that names no other body, or a 503 with Retry-After
    for a file being written; and the settle rule engaged (some reads overlapped a rewrite)."""
    bodies: dict[tuple[str, str, str | None], bytes] = {}
    counts = {200: 0, 503: 0}
    for answer in answers:
        assert answer.status in (200, 503), (answer.server, answer.key, answer.status, answer.body[:200])
        counts[answer.status] += 1
        if answer.status == 503:
            assert answer.retry_after is not None and int(answer.retry_after) >= 1
            assert "written" in json.loads(answer.body)["error"]  # being (re)written
            continue
        assert versions_of(answer), f"{answer.server} {answer.key}: a body that is neither the old nor the new data"
        assert answer.etag is not None
        first = bodies.setdefault((answer.server, answer.key, answer.etag), answer.body)
        assert first == answer.body, f"{answer.server} {answer.key}: ETag {answer.etag} names two bodies"
    assert counts[503] > 0, "the rule never engaged: the test did not read while the file was being written"


def wait_until_served(url: str, accept: Callable[[requests.Response], bool] = lambda r: True) -> requests.Response:
    """GET ``url`` until it answers 200 (bounded); 404 and 503 are the only answers allowed meanwhile."""
    seen: list[requests.Response] = []

    def served() -> requests.Response | None:
        response = requests.get(url, timeout=30)
        seen.append(response)
        if response.status_code == 200 and accept(response):
            return response
        assert response.status_code in (200, 404, 503), (response.status_code, response.text)
        if response.status_code == 503:
            assert int(response.headers["Retry-After"]) >= 1, response.headers
        return None

    answer = wait_until(served, timeout=WAIT_SECONDS, interval=0.2)
    if answer is None:
        pytest.fail(f"{url} still answers {seen[-1].status_code} {seen[-1].text!r} after {WAIT_SECONDS} s")
    return answer
