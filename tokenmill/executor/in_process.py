"""InProcessExecutor: one worker, in this process and on the calling thread (the engine thread, which
then does all the torch work: see engine/async_engine.py on OpenMP thread teams)."""

from __future__ import annotations

from tokenmill.executor.executor import Executor
from tokenmill.scheduler_output import ModelRunnerOutput, SchedulerOutput
from tokenmill.worker.worker import Worker
from tokenmill.worker.worker_config import WorkerConfig


class InProcessExecutor(Executor):
    def __init__(self, config: WorkerConfig) -> None:
        super().__init__(config)
        self.worker: Worker | None = Worker(config)

    def num_kv_blocks(self) -> int:
        assert self.worker is not None
        return self.worker.num_kv_blocks

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        assert self.worker is not None, "the executor was shut down"
        return self.worker.execute_model(scheduler_output)

    def shutdown(self) -> None:
        self.worker = None
