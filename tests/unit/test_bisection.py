from kafka2delta.bisection import isolate_failures


def test_isolate_failures_finds_each_bad_index_and_keeps_order() -> None:
    bad = {3, 4, 17}
    calls = []

    def attempt(chunk: list[int]) -> list[int]:
        calls.append(len(chunk))
        if bad & set(chunk):
            raise ValueError(f"bad in {chunk}")
        return chunk

    good, failures = isolate_failures(list(range(20)), attempt, (ValueError,))
    assert [i for i, _ in failures] == [3, 4, 17]
    assert [i for chunk, _ in good for i in chunk] == [i for i in range(20) if i not in bad]
    assert len(calls) < 40  # bisection, not one call per message


def test_isolate_failures_fast_path_is_one_call() -> None:
    calls: list[list[int]] = []

    def attempt(chunk: list[int]) -> int:
        calls.append(chunk)
        return len(chunk)

    good, failures = isolate_failures(list(range(1000)), attempt, (ValueError,))
    assert len(calls) == 1 and failures == [] and good[0][1] == 1000
