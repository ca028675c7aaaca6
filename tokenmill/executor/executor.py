"""The executor seam: how the engine reaches its workers. It sends only plain data (WorkerConfig once,
SchedulerOutput per step) and gets plain data back (ModelRunnerOutput), so an executor that runs the
workers in other processes (tensor parallelism) can replace the in-process one without the engine
changing."""

from __future__ import annotations

from abc import ABC, abstractmethod

from tokenmill.scheduler_output import ModelRunnerOutput, SchedulerOutput
from tokenmill.worker.worker_config import WorkerConfig


class Executor(ABC):
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config

    @abstractmethod
    def num_kv_blocks(self) -> int:
        """Blocks the workers' KV caches hold (what the block manager may hand out)."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    def shutdown(self) -> None:
        """Release the workers."""
