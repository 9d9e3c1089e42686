"""Byte ranges: ``parse_range`` on its own, then every file route of a real server against a whole-object GET."""

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from support.datasets import ORG
from support.datasets import WrittenDataset as Data
from support.servers import Server

from gateway.http.ranges import (
    MAX_POSITION_DIGITS,
    MAX_RANGES,
    PositionTooLong,
    TooManyRanges,
    Unsatisfiable,
    parse_range,
)

DATASET = "wk_dataset"

# --- parse_range ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "size", "spans"),
    [
        ("bytes=0-9", 100, [(0, 10)]),
        ("bytes=0-0", 100, [(0, 1)]),
        ("bytes=99-99", 100, [(99, 100)]),
        ("bytes=10-", 100, [(10, 100)]),
        ("bytes=0-", 100, [(0, 100)]),
        ("bytes=-10", 100, [(90, 100)]),
        ("bytes=-100", 100, [(0, 100)]),
        ("bytes=-250", 100, [(0, 100)]),  # a suffix longer than the object is the whole object
        ("bytes=90-250", 100, [(90, 100)]),  # the end is clamped
        ("bytes=0-9,20-29", 100, [(0, 10), (20, 30)]),
        ("bytes=50-59,0-9,-5", 100, [(50, 60), (0, 10), (95, 100)]),  # kept in the order asked
        ("bytes=0-9, 20-29", 100, [(0, 10), (20, 30)]),  # optional whitespace
        ("BYTES=0-9", 100, [(0, 10)]),  # the unit is case-insensitive
        ("bytes=200-300,5-6", 100, [(5, 7)]),  # unsatisfiable ranges of a set are dropped
        ("bytes=0-49,40-59", 100, [(0, 50), (40, 60)]),  # overlapping, but no more than the object
    ],
)
def test_parse_valid(header: str, size: int, spans: list[tuple[int, int]]) -> None:
    assert parse_range(header, size) == spans


@pytest.mark.parametrize(
    "header",
    [
        "bytes=5-2",
        "bytes=abc",
        "items=0-1",
        "bytes=",
        "bytes=-",
        "bytes=1-2-3",
        "bytes=0-1,",
        "bytes=0-1,x",
        "bytes=+1-2",
        "bytes=0x10-20",
        "bytes=1 -2",
        "0-1",
        "",
        "bytes=0-,0-",  # twice the whole object: ignored rather than sent twice
        "bytes=0-99,-100,50-",
    ],
)
def test_parse_ignores_what_is_not_a_usable_range_set(header: str) -> None:
    assert parse_range(header, 100) is None


def test_parse_without_header() -> None:
    assert parse_range(None, 100) is None


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=100-", 100),
        ("bytes=100-200", 100),
        ("bytes=-0", 100),
        ("bytes=0-", 0),
        ("bytes=-5", 0),
        ("bytes=500-,100-", 100),
    ],
)
def test_parse_unsatisfiable(header: str, size: int) -> None:
    with pytest.raises(Unsatisfiable):
        parse_range(header, size)


def test_parse_too_many() -> None:
    assert len(parse_range("bytes=" + ",".join(f"{i}-{i}" for i in range(MAX_RANGES)), 1000) or []) == MAX_RANGES
    with pytest.raises(TooManyRanges):
        parse_range("bytes=" + ",".join(f"{i}-{i}" for i in range(MAX_RANGES + 1)), 1000)
    with pytest.raises(TooManyRanges):
        parse_range("bytes=" + ",".join(["0-0"] * 1000), 1000)


@pytest.mark.parametrize(
    "header",
    [
        "bytes=" + "0" * 20000 + "-1",  # Python's int() refuses more than 4,300 digits
        "bytes=0-" + "9" * 20000,
        "bytes=-" + "1" * 5000,
        "bytes=0-1," + "0" * (MAX_POSITION_DIGITS + 1) + "-",
    ],
)
def test_parse_refuses_overlong_positions(header: str) -> None:
    with pytest.raises(PositionTooLong):
        parse_range(header, 100)


def test_parse_takes_the_longest_position_allowed() -> None:
    assert parse_range("bytes=" + "0" * MAX_POSITION_DIGITS + "-" + "9" * MAX_POSITION_DIGITS, 100) == [(0, 100)]


# --- the server against the whole object -----------------------------------------------------------


@dataclass(frozen=True)
class Target:
    url: str
    whole: bytes
    session: requests.Session


def _target(session: requests.Session, url: str) -> Target:
    response = session.get(url)
    assert response.status_code == 200, url
    assert response.headers["Accept-Ranges"] == "bytes"
    assert int(response.headers["Content-Length"]) == len(response.content) > 0
    return Target(url, response.content, session)


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


@pytest.fixture(scope="module")
def targets(sharded_gateway: Server, session: requests.Session) -> dict[str, Target]:
    """A v3 shard, a v2 plain chunk, a metadata file and a listing, each with its whole body."""
    v3 = f"{sharded_gateway.url}/data/zarr3/{ORG}/{DATASET}"
    v2 = f"{sharded_gateway.url}/data/zarr/{ORG}/{DATASET}"
    return {
        "shard": _target(session, f"{v3}/color_u8/1/c/0/1/1/0"),
        "chunk": _target(session, f"{v2}/color_u16/1/0.2.1.1"),
        "metadata": _target(session, f"{v3}/zarr.json"),
        "listing": _target(session, f"{v2}/"),
    }


def _spec(kind: str, a: int, b: int) -> str:
    return {"closed": f"{a}-{b}", "open": f"{a}-", "suffix": f"-{b}"}[kind]


def _span(kind: str, a: int, b: int, size: int) -> tuple[int, int] | None:
    """The half-open span a satisfiable range means, or None if it is unsatisfiable."""
    if kind == "suffix":
        return (max(size - b, 0), size) if b > 0 and size > 0 else None
    if a >= size:
        return None
    return (a, size) if kind == "open" else (a, min(b + 1, size))


def _ranges(size: int) -> st.SearchStrategy[tuple[str, int, int]]:
    position = st.one_of(
        st.integers(0, size + 64), st.sampled_from([0, 1, size - 2, size - 1, size, size + 1, 10 * size])
    )
    kind = st.sampled_from(["closed", "open", "suffix"])
    return st.tuples(kind, position, st.integers(0, size + 64)).map(
        lambda t: (t[0], t[1], t[1] + t[2] if t[0] == "closed" else t[2])
    )


def _parse_multipart(response: requests.Response) -> list[tuple[int, int, int, bytes]]:
    """``(first, last, size, data)`` of each part of a ``multipart/byteranges`` body, read by length."""
    match = re.fullmatch(r"multipart/byteranges;\s*boundary=(\S+)", response.headers["Content-Type"])
    assert match, response.headers["Content-Type"]
    delimiter = b"--" + match.group(1).strip('"').encode()
    body = response.content
    parts: list[tuple[int, int, int, bytes]] = []
    position = 0
    while True:
        assert body.startswith(delimiter, position), body[position : position + 80]
        position += len(delimiter)
        if body.startswith(b"--", position):
            assert body[position + 2 :] in (b"", b"\r\n")
            return parts
        assert body.startswith(b"\r\n", position)
        end_of_headers = body.index(b"\r\n\r\n", position)
        headers = dict(
            line.split(": ", 1) for line in body[position + 2 : end_of_headers].decode("latin-1").split("\r\n")
        )
        headers = {k.lower(): v for k, v in headers.items()}
        content_range = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", headers["content-range"])
        assert content_range, headers["content-range"]
        first, last, size = map(int, content_range.groups())
        position = end_of_headers + 4
        parts.append((first, last, size, body[position : position + last - first + 1]))
        position += last - first + 1
        assert body.startswith(b"\r\n", position)
        position += 2


def check_ranges(target: Target, ranges: list[tuple[str, int, int]], method: str = "GET") -> requests.Response:
    """Send the ranges and check the answer is exactly what RFC 9110 allows for them."""
    size = len(target.whole)
    header = "bytes=" + ",".join(_spec(*r) for r in ranges)
    response = target.session.request(method, target.url, headers={"Range": header})
    assert response.headers["Accept-Ranges"] == "bytes"
    body = response.content
    if method == "GET":
        assert int(response.headers["Content-Length"]) == len(body)
    else:
        assert body == b""
    spans = [s for s in (_span(*r, size) for r in ranges) if s is not None]
    if not spans:
        assert response.status_code == 416, (header, response.status_code)
        assert response.headers["Content-Range"] == f"bytes */{size}"
        return response
    if response.status_code == 200:  # ignoring the ranges is allowed for a set of several
        assert len(spans) > 1, header
        if method == "GET":
            assert body == target.whole
        assert int(response.headers["Content-Length"]) == size
        return response
    assert response.status_code == 206, (header, response.status_code)
    if len(spans) == 1:
        start, end = spans[0]
        assert response.headers["Content-Range"] == f"bytes {start}-{end - 1}/{size}"
        assert int(response.headers["Content-Length"]) == end - start
        if method == "GET":
            assert body == target.whole[start:end]
        return response
    if method == "HEAD":
        return response
    parts = _parse_multipart(response)
    covered = np.zeros(size, dtype=bool)
    for first, last, part_size, data in parts:
        assert part_size == size
        assert data == target.whole[first : last + 1]
        covered[first : last + 1] = True
    for start, end in spans:
        assert covered[start:end].all(), (header, start, end)
    return response


@pytest.mark.parametrize("name", ["shard", "chunk", "metadata", "listing"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_single_range_is_the_exact_slice(targets: dict[str, Target], name: str, data: st.DataObject) -> None:
    target = targets[name]
    check_ranges(target, [data.draw(_ranges(len(target.whole)), label="range")])


@pytest.mark.parametrize("name", ["shard", "chunk", "metadata"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_range_sets(targets: dict[str, Target], name: str, data: st.DataObject) -> None:
    target = targets[name]
    ranges = data.draw(st.lists(_ranges(len(target.whole)), min_size=2, max_size=6), label="ranges")
    check_ranges(target, ranges)
    check_ranges(target, ranges, method="HEAD")


def test_range_edges_of_a_shard(targets: dict[str, Target]) -> None:
    target = targets["shard"]
    size = len(target.whole)
    for kind, a, b in [
        ("suffix", 0, 16 * 64 + 4),  # the shard index, as zarr-python asks for it
        ("closed", 0, 0),
        ("closed", size - 1, size - 1),
        ("closed", size - 1, size + 1000),
        ("closed", size, size),
        ("open", size, 0),
        ("suffix", 0, 0),
        ("suffix", 0, size),
        ("suffix", 0, size + 1),
    ]:
        check_ranges(target, [(kind, a, b)])
        check_ranges(target, [(kind, a, b)], method="HEAD")


def test_multipart_answer(targets: dict[str, Target]) -> None:
    target = targets["shard"]
    response = check_ranges(target, [("closed", 0, 99), ("closed", 1000, 1999), ("suffix", 0, 50)])
    assert response.status_code == 206
    parts = _parse_multipart(response)
    size = len(target.whole)
    assert [(first, last) for first, last, _, _ in parts] == [(0, 99), (1000, 1999), (size - 50, size - 1)]
    # an unsatisfiable member of a set is dropped; what is left is a single range
    response = check_ranges(target, [("closed", 10, 19), ("open", size + 5, 0)])
    assert response.headers["Content-Range"] == f"bytes 10-19/{size}"


@pytest.mark.parametrize("name", ["shard", "chunk", "metadata", "listing"])
@pytest.mark.parametrize(
    "header", ["bytes=5-2", "bytes=abc", "items=0-1", "bytes=", "bytes=1-2-3", "bytes=0-1,x", "bytes=0-,0-,0-,0-"]
)
def test_malformed_ranges_give_the_whole_object(targets: dict[str, Target], name: str, header: str) -> None:
    target = targets[name]
    response = target.session.get(target.url, headers={"Range": header})
    assert response.status_code == 200
    assert response.content == target.whole
    assert response.headers["Accept-Ranges"] == "bytes"
    assert "Content-Range" not in response.headers


@pytest.mark.parametrize("name", ["shard", "metadata"])
def test_absurd_number_of_ranges_is_refused(targets: dict[str, Target], name: str) -> None:
    target = targets[name]
    for count in (MAX_RANGES + 1, 1000):
        header = "bytes=" + ",".join(f"{i}-{i}" for i in range(count))
        response = target.session.get(target.url, headers={"Range": header})
        assert 400 <= response.status_code < 500
        assert response.json()["error"]


def test_overlapping_ranges_never_amplify(targets: dict[str, Target]) -> None:
    """Sixty copies of the whole shard in one request would be a sixty-fold answer: it is sent once."""
    target = targets["shard"]
    response = target.session.get(target.url, headers={"Range": "bytes=" + ",".join(["0-"] * 60)})
    assert response.status_code == 200
    assert response.content == target.whole


@settings(max_examples=200, deadline=None)
@given(header=st.text(alphabet="bytes=0123456789-, items\t*", max_size=40).map(str.lstrip))
def test_no_range_header_makes_a_server_error(targets: dict[str, Target], header: str) -> None:
    target = targets["shard"]
    response = target.session.get(target.url, headers={"Range": header})
    assert response.status_code in (200, 206, 400, 416), (header, response.status_code)
    if response.status_code == 200:
        assert response.content == target.whole


@pytest.mark.parametrize("name", ["shard", "chunk", "metadata", "listing"])
@pytest.mark.parametrize(
    "header", ["bytes=" + "0" * 20000 + "-1", "bytes=0-" + "9" * 20000, "bytes=-" + "0" * 20000 + "1"]
)
def test_huge_positions_are_a_400_with_a_message(targets: dict[str, Target], name: str, header: str) -> None:
    target = targets[name]
    response = target.session.get(target.url, headers={"Range": header})
    assert response.status_code == 400, response.text[:200]
    assert "digits" in response.json()["error"]


def _numbers() -> st.SearchStrategy[str]:
    """A range position as a client might write it: any value, after any number of leading zeros."""
    return st.builds(lambda zeros, value: "0" * zeros + str(value), st.integers(0, 6000), st.integers(0, 10**40))


_LONG_RANGE_SETS = st.lists(
    st.one_of(
        st.builds(lambda a, b: f"{a}-{b}", _numbers(), _numbers() | st.just("")),
        st.builds(lambda a: f"-{a}", _numbers()),
    ),
    min_size=1,
    max_size=3,
).map(lambda specs: "bytes=" + ",".join(specs))


@settings(max_examples=60, deadline=None)
@given(header=_LONG_RANGE_SETS)
def test_no_long_position_makes_a_server_error(targets: dict[str, Target], header: str) -> None:
    target = targets["shard"]
    response = target.session.get(target.url, headers={"Range": header})
    assert response.status_code in (200, 206, 400, 416), (header[:100], response.status_code)
    if response.status_code == 400:
        assert "digits" in response.json()["error"]


# --- a range read of a shard reads only the blocks it covers ---------------------------------------


def _rchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/<pid>/io")
@pytest.mark.parametrize("layer", ["color_f32", "color_u8"])
def test_range_read_of_a_shard_reads_little_from_disk(
    sharded_gateway: Server, test_data: Data, session: requests.Session, layer: str
) -> None:
    url = f"{sharded_gateway.url}/data/zarr3/{ORG}/{DATASET}/{layer}/1/c/0/0/0/0"
    file_size = (test_data.mag_dir(layer, (1, 1, 1)) / "z0" / "y0" / "x0.wkw").stat().st_size
    pid = sharded_gateway.serving_pid()
    size = int(session.head(url).headers["Content-Length"])  # plans the shard: header and jump table
    index = session.get(url, headers={"Range": f"bytes=-{16 * 64 + 4}"}).content
    offset, length = (int(v) for v in np.frombuffer(index[:-4], dtype="<u8").reshape(4, 4, 4, 2)[2, 1, 1])
    middle = offset + length // 2  # inside an inner chunk that is a stored block passed through

    before = _rchar(pid)
    response = session.get(url, headers={"Range": f"bytes={middle}-{middle + 99}"})
    small = _rchar(pid) - before
    assert response.status_code == 206
    assert len(response.content) == 100

    before = _rchar(pid)
    assert len(session.get(url).content) == size
    whole = _rchar(pid) - before
    # the measurement does see whole reads; a 100-byte range costs about the one block it lies in
    assert whole >= file_size // 2, (whole, file_size)
    assert small < file_size // 16, (small, file_size)
    assert small <= length + (16 << 10), (small, length)
