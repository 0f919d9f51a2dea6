"""One run of a :class:`~sparkml_dist.tune.Tuner`: trial threads, the channel, the records.  [driver]

``max_concurrent`` threads each take the next trial from the Optuna study (``study.ask``, under a
lock), run it as a one-task Spark job under its own job tag, and tell the study how it ended.  The
channel's thread hands each report to the pruner and answers the trial (stop or go on).  The main
thread waits, applies ``timeout`` (stop, then cancel after ``stop_grace``) and Ctrl-C (cancel
exactly the tuner's jobs).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from typing import Dict, Optional

from .. import _spark_env, launch, progress, serialization
from ..channel import new_secret
from ..channel.server import listen
from ..errors import ConfigurationError
from .gang import Gangs, StepAnswers
from .result import TrialRecord, TuneResult, best_record, trial_value
from .trial import FRAME_REPORT, TrialSpec, trial_task

log = logging.getLogger(__name__)


def _optuna():
    import optuna

    return optuna


class Tuning:
    """One run of a Tuner: the trial threads, the channel and the records."""

    def __init__(
        self, tuner, spark, study, slots, run, kept: Optional[Dict[int, TrialRecord]] = None
    ) -> None:
        self.t, self.spark, self.study, self.slots, self.run = tuner, spark, study, slots, run
        self.lock = threading.Lock()
        self.records: Dict[int, TrialRecord] = dict(kept or {})  # kept: an earlier run's finished trials
        self.launched = len(self.records)
        self.gangs: Optional[Gangs] = None
        self.stopping: Optional[str] = None
        self.failure: Optional[BaseException] = None
        self.secret = new_secret()
        self.key = serialization.digest(tuner.payload)
        self.run_id = uuid.uuid4().hex[:8]
        self.warned_unreachable = False

    # ----------------------------------------------------------------- trials
    def _next(self) -> Optional[TrialRecord]:
        with self.lock:
            if self.stopping or self.launched >= self.t.n_trials:
                return None
            trial = self.study.ask(self.t.dists)
            self.launched += 1
            rec = TrialRecord(trial, {**trial.params, **self.t.constants})
            rec.child = self.run.child(f"trial {trial.number}", rec.params)  # before any report
            self.records[trial.number] = rec
        return rec

    def _worker(self, server) -> None:
        try:
            while True:
                rec = self._next()
                if rec is None:
                    return
                self._finish(rec, self._launch(rec, server))
        except BaseException as exc:  # noqa: BLE001 - raised again on the driver's main thread
            with self.lock:
                self.failure = self.failure or exc
                self.stopping = self.stopping or "error"

    def _launch(self, rec: TrialRecord, server) -> dict:
        number = rec.trial.number
        channel = (server.address, server.port)
        rec.tag = launch.JobTag(self.spark, f"tune-{self.run_id}-{number}")
        rec.started = time.time()
        if self.gangs is not None:  # a barrier run of ranks_per_trial ranks (tune.gang)
            rec.answers = StepAnswers()
            result = self.gangs.run(
                TrialSpec(number, rec.params, self.t.payload, self.key, channel, self.secret), rec.tag
            )
            if not result.get("ok") and rec.stop_reason:
                result = {**result, "error": f"cancelled ({rec.stop_reason})", "cancelled": True}
            if rec.answers.mismatch and result.get("ok"):
                result = {
                    **result,
                    "ok": False,
                    "error": f"the gang's ranks disagree: {rec.answers.mismatch}",
                }
            return result
        pool = self.slots.gpu_pool
        gpus = pool.take() if pool is not None else None
        spec = TrialSpec(number, rec.params, self.t.payload, self.key, channel, self.secret, gpus)
        try:
            results = launch.run_on_groups(
                self.spark.range(0, 1, 1, 1),
                trial_task,
                spec,
                expected_groups=[number],
                description=f"sparkml_dist: tuner trial {number}",
                what="trial",
                profile=self.slots.profile,
                tag=rec.tag,
            )
            return results[(number, 0)]
        except Exception as exc:  # the job failed or was cancelled: the tuning goes on
            why = f"cancelled ({rec.stop_reason})" if rec.stop_reason else f"{type(exc).__name__}: {exc}"
            return {"ok": False, "error": why, "cancelled": bool(rec.stop_reason)}
        finally:
            if gpus is not None:
                pool.give(gpus)

    def _finish(self, rec: TrialRecord, result: dict) -> None:
        if result.get("unreachable") and not self.warned_unreachable:
            self.warned_unreachable = True
            log.warning(
                "Tuner: trial %d could not reach the driver's channel %s: its reports arrive only with "
                "its result, so early stopping and live metrics are off for such trials (executors "
                "must reach the driver, as for a remote Spark Connect client they may not)",
                rec.trial.number,
                result["unreachable"],
            )
        with self.lock:
            rec.absorb(result)
            value, missing = trial_value(result, rec, self.t.metric)
            optuna = _optuna()
            if missing and not self.stopping:
                self.failure = ConfigurationError(
                    f"metric={self.t.metric!r} was never reported by trial {rec.trial.number}: {missing}. "
                    "Return it (return {'" + self.t.metric + "': value}) or report it "
                    f"(trial.report(step, {self.t.metric}=value)), or fix metric="
                )
                self.stopping = "error"
            if value is not None and math.isnan(value):
                rec.state, rec.error, value = "failed", f"{self.t.metric} is NaN", None
            if rec.state == "failed" or value is None:
                rec.state = "cancelled" if result.get("cancelled") else "failed"
                if rec.error:  # kept with the study: a resumed tuning still says why
                    rec.trial.set_user_attr("sparkml_dist_error", rec.error[-4000:])
                self.study.tell(rec.trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            elif rec.stop_reason:
                rec.state, rec.value = "stopped", value
                self.study.tell(rec.trial, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
            else:
                rec.state, rec.value = "complete", value
                self.study.tell(rec.trial, value, skip_if_finished=True)
        self.run.end_child(rec.child, rec.state, rec.final_metrics(self.t.metric), rec.last_step)
        self.bar.update(1)
        best = self._best()
        if best is not None:
            self.bar.set_postfix_str(f"best {self.t.metric}={best.value:.4g} (trial {best.trial.number})")

    # ----------------------------------------------------------------- the channel
    def on_message(self, message: dict, send) -> None:
        if message.get("type") != FRAME_REPORT:
            return
        rec = self.records.get(message.get("trial"))
        if rec is None:
            return
        step, metrics, rank = message.get("step"), message.get("metrics"), message.get("rank")
        if not isinstance(step, int) or not isinstance(metrics, dict):
            return  # Trial.report never sends these
        if rank is not None and rank != 0 and rec.answers is not None:  # a gang's other rank: rank 0 decides
            if isinstance(rank, int):
                stop = rec.answers.ask(rank, step, message.get("seq"), send)
                if stop is not None:
                    send({"seq": message.get("seq"), "stop": stop})
            return
        metrics = {k: (float("nan") if v is None else v) for k, v in metrics.items()}
        with self.lock:
            if rec.state != "running":
                return  # a report arriving after its trial ended: Optuna would refuse it
            rec.send = send
            rec.history[step] = metrics
            value = metrics.get(self.t.metric)
            if value is not None and not rec.stop_reason:
                rec.trial.report(float(value), step)
                if rec.trial.should_prune():
                    rec.stop_reason = "early stopping"
            stop = bool(rec.stop_reason)
        self.run.child_metrics(rec.child, metrics, step)
        send({"seq": message.get("seq"), "stop": stop})
        if rec.answers is not None:  # the gang's other ranks' answers for this step, the same
            for seq, other, answer in rec.answers.decide(step, stop):
                other({"seq": seq, "stop": answer})

    def _stop_running(self, reason: str) -> None:
        with self.lock:
            self.stopping = self.stopping or reason
            running = [r for r in self.records.values() if r.state == "running"]
            for rec in running:
                rec.stop_reason = rec.stop_reason or reason
        for rec in running:
            if rec.send is not None:
                rec.send({"stop": True})

    def _cancel_running(self) -> None:
        for rec in list(self.records.values()):
            if rec.state == "running" and rec.tag is not None:
                rec.stop_reason = rec.stop_reason or "cancelled"
                rec.tag.cancel()

    # ----------------------------------------------------------------- the whole run
    def execute(self) -> TuneResult:
        self.bar = progress.bar(self.t.n_trials, "trials", self.t.progress, unit="trial")
        self.bar.update(len(self.records))  # kept from an earlier run of the same study
        self.gangs = Gangs(self.t, self.spark) if self.t.gang else None
        per_trial = self.t.ranks_per_trial if self.gangs is not None else 1
        host = _spark_env.driver_host(self.spark)
        peers = min(self.slots.concurrency, self.t.n_trials) * per_trial
        # every trial running at once may be mid-handshake: none of them is evicted as a stranger
        server = listen(self.secret, self.on_message, host, replies=True, expected=peers)
        threads = [
            threading.Thread(target=self._worker, args=(server,), name=f"sparkml_dist-trial-{i}", daemon=True)
            for i in range(min(self.slots.concurrency, self.t.n_trials))
        ]
        start = time.monotonic()
        deadline = start + self.t.timeout if self.t.timeout else None
        stop_at = None
        try:
            with launch.own_interrupts():
                for th in threads:
                    th.start()
                while any(th.is_alive() for th in threads):
                    for th in threads:
                        th.join(0.1)
                    now = time.monotonic()
                    if deadline is not None and now > deadline and not self.stopping:
                        self._stop_running(f"timeout={self.t.timeout}s")
                    if self.stopping and stop_at is None:
                        stop_at = now + (0 if self.failure else self.t.stop_grace)
                    if stop_at is not None and now > stop_at:
                        self._cancel_running()
        except KeyboardInterrupt:
            self._stop_running("interrupted")
            self._cancel_running()
            for th in threads:
                th.join(10)
            raise
        finally:
            server.close()
            self.bar.close()
            if self.gangs is not None:
                self.gangs.close()
        if self.failure is not None:
            raise self.failure
        return TuneResult.build(self.records, self.t, self.study, time.monotonic() - start)

    def _best(self) -> Optional[TrialRecord]:
        return best_record(self.records.values(), self.t.mode)
