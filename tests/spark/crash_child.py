"""The pipeline as a separate driver process, for the crash test to SIGKILL.

Usage: python -m tests.spark.crash_child CHANGELOG LAKE CHECKPOINT (stream|once) (driver|executors)
"""

from __future__ import annotations

import sys

from pgcdc.spark.pipeline import PipelineConfig, run_once, spark_session, start


def main(changelog: str, lake: str, checkpoint: str, mode: str, writes: str) -> None:
    config = PipelineConfig(
        changelog=changelog,
        lake=lake,
        checkpoint=checkpoint,
        # Small batches: the test's fixed workload must outlast its ten kills, or the last
        # kills find a driver with nothing left to write (faster Delta writes got there).
        max_changes_per_batch=60,
        trigger_interval=0.2,
        writes=writes,
    )
    spark = spark_session("local[2]", "pgcdc-crash", **{"spark.ui.showConsoleProgress": "false"})
    if mode == "once":
        run_once(spark, config)
        spark.stop()
        return
    start(spark, config).awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:6])
