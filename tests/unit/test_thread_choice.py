"""layers/thread_choice.py: one thread or all per size class, chosen by timing both; a fake clock plays the
machine (quiet: all threads cheaper; busy: a 2-thread region 20x dearer)."""

from __future__ import annotations

from tokenmill.layers.thread_choice import ThreadChooser


class Machine:
    """Calls cost `per_mac[threads]` ns per multiply-add; the clock advances by what each call costs."""

    def __init__(self, per_mac: dict[int, float]) -> None:
        self.per_mac, self.now, self.spent = per_mac, 0, 0.0

    def clock(self) -> int:
        return int(self.now)

    def call(self, macs: int, threads: int) -> None:
        cost = self.per_mac[threads] * macs
        self.now += cost
        self.spent += cost


def run(chooser: ThreadChooser, machine: Machine, macs: int, calls: int) -> list[int]:
    used: list[int] = []
    for _ in range(calls):
        chooser.run(macs, lambda t: (used.append(t), machine.call(macs, t)))
    return used


def test_moves_to_all_threads_on_a_quiet_machine_and_back_to_one_when_busy() -> None:
    m = Machine({1: 1.0, 2: 0.55})
    c = ThreadChooser(2, m.clock)
    used = run(c, m, 1 << 20, 200)  # a small matmul: starts on one thread
    assert used[0] == 1 and used[-50:] == [2] * 50
    m.per_mac = {1: 1.0, 2: 20.0}  # another process takes a core
    before = m.spent
    used = run(c, m, 1 << 20, 4000)
    assert used[-100:] == [1] * 100
    probes = sum(t == 2 for t in used[100:])
    assert probes <= 8, f"{probes} all-thread probes under contention in 3900 calls"  # backed off
    # what contention cost: within 15% of always choosing one thread
    assert m.spent - before < 1.15 * 4000 * (1 << 20)


def test_a_big_matmul_starts_on_all_threads_and_leaves_them_under_contention() -> None:
    m = Machine({1: 1.0, 4: 5.0})
    c = ThreadChooser(4, m.clock)
    used = run(c, m, 1 << 26, 100)
    assert used[0] == 4 and used[-50:].count(1) >= 49


def test_choices_are_per_size_class_and_a_team_of_one_is_not_timed() -> None:
    m = Machine({1: 1.0, 2: 0.5})
    c = ThreadChooser(2, m.clock)
    run(c, m, 1 << 20, 100)
    assert len(c.classes) == 1 and c.classes[(1 << 20).bit_length()].threads == 2
    run(c, m, 1 << 10, 1)
    assert len(c.classes) == 2
    solo = ThreadChooser(1, lambda: 1 / 0)  # type: ignore[arg-type]  # the clock is never read
    assert run(solo, m, 1 << 20, 10) == [1] * 10
