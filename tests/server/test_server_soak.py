"""A short soak: 500 requests, 64 at a time, 30% of the clients hanging up at a random moment.

Every completed answer must equal the one computed up front for its variant (greedy or seeded, completions
or chat, streamed or not), no answer may be an error, and afterwards the server must hold no requests and
no KV blocks. The long version (10,000 requests) is `tokenmill bench soak`.

The clients' hang-up delays are drawn up to the measured time of one batch of requests (the expected
answers, 32 at once, asked a second time), not a fixed time: on a fast machine a fixed delay would outlast
most requests and few clients would really hang up; on a slow one every delay is within a request's life.
"""

from __future__ import annotations

import asyncio
import time

from conftest import API_KEY
from server_process import ServerProcess

from tokenmill.benchmarks.soak import (SoakReport, checked_variants, compute_expected, make_client, run_soak,
                                       wait_idle)

MAX_TOKENS = 8


def test_soak_500_requests_64_concurrent_with_disconnects(server: ServerProcess) -> None:
    async def main() -> tuple[SoakReport, dict[str, float]]:
        async with make_client(server.url, 64, API_KEY) as client:
            variants = checked_variants()
            expected = await compute_expected(client, variants, MAX_TOKENS)
            t0 = time.perf_counter()  # timed once warm: 32 requests at once, less than a request's life at 64
            assert await compute_expected(client, variants, MAX_TOKENS) == expected
            batch_s = time.perf_counter() - t0
            report = await run_soak(client, num_requests=500, concurrency=64, max_tokens=MAX_TOKENS,
                                    disconnect_fraction=0.3, max_disconnect_delay_s=batch_s, seed=4,
                                    variants=variants, expected=expected)
            print(f"hang-up delays up to {batch_s:.2f}s")
            return report, await wait_idle(client)

    report, gauges = asyncio.run(main())
    summary = (f"{report.num_completed} completed, {report.num_disconnected} disconnected, errors "
               f"{report.errors_by_status}, wrong {report.wrong_examples}, {report.wall_s:.1f}s")
    print(summary)
    assert report.errors_by_status == {}, summary
    assert report.num_wrong == 0, summary
    assert report.num_completed + report.num_disconnected == 500, summary
    assert report.num_disconnected >= 50 and report.num_checked >= 250, summary  # both kinds really happened
    assert gauges == {"num_requests_running": 0.0, "num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.0,
                      "num_preemptions_total": gauges["num_preemptions_total"]}, gauges
