"""The driver of a pipeline on Ray: stage actors, chunks flowing through them, failures made typed.

The driver holds the tokenizer and samples; stage i holds layers [a_i, b_i) (the first also the
embedding, the last the output projection). Every chunk of ubatch.chunks (llama.cpp's ubatch
boundaries, the same arithmetic as one process) is submitted to every stage at once, each stage's
call taking the previous one's ObjectRef: Ray runs an actor's calls in submission order, so while
stage 1 computes chunk k, stage 0 computes chunk k+1 (a pipelined prefill), and the driver waits
only for the last stage's logits. `Pipeline` quacks like engine.Engine (eval, reset, generate,
tokenizer, timings), so api.Model, the CLI and the servers drive it unchanged.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..engine.engine import Engine, Timings
from ..errors import (ClusterError, ClusterUnreachable, ContextLengthExceeded, EmptyPrompt, InvalidArgument,
                      MissingExtra, RamforgeError, StageFailed, check_token_ids)
from ..gguf.reader import GGUFFile
from ..stream.plan import UBATCH
from ..store.resolve import resolve_model
from ..engine.ubatch import chunks
from .split import plan_stages
from .stage import Stage, identity

# Ray passes an object below max_direct_call_object_size inline through its owner (the driver), above
# it through the object store. A logits row (n_vocab float32, up to 1 MiB) inline costs one message
# instead of a store round trip (2.5 ms of 5.5 measured per token; docs/DISTRIBUTED.md). Ray starts its
# workers at nice 15: a stage is the workload, not a background job (beside other processes it ran
# 15% slower). Applied to a cluster this process starts; `ray start` takes them as environment
# variables: RAY_max_direct_call_object_size=2097152 RAY_worker_niceness=0.
RAY_SYSTEM_CONFIG = {"max_direct_call_object_size": 2 << 20, "task_rpc_inlined_bytes_limit": 16 << 20,
                     "worker_niceness": 0}
# A stage's OpenMP threads (numba's omp layer, libgomp) spin 300,000 times (milliseconds) for more work
# after each parallel loop. Between tokens a stage waits for the other stages: that spin takes the
# cores from the stage computing now when they share a machine. 10,000 still spans the gaps between
# the loops of one pass. Measured: docs/DISTRIBUTED.md. A runtime_env's own env_vars win.
STAGE_ENV = {"GOMP_SPINCOUNT": "10000"}
DEFAULT_PORT = 6379                 # the GCS port of `ray start --head`
CLIENT_PORT = 10001                 # Ray Client's, for ray://
IN_FLIGHT_PER_STAGE = 2             # chunks submitted ahead of the last stage's results, per stage
CONNECT_TIMEOUT = 15.0              # seconds to reach and join a cluster at an address (--ray-timeout)
STAGE_TIMEOUT = 300.0               # seconds a chunk may take through the stages (--stage-timeout)
PLACEMENTS = ("spread", "strict")   # one stage per node; fewer nodes: shared (spread) or refused (strict)
log = logging.getLogger("ramforge.cluster")


def import_ray():
    try:
        import ray
    except ImportError:
        raise MissingExtra("--ray needs Ray: pip install 'ramforge[cluster]'") from None
    return ray


def connect(address: str | None = None, timeout: float = CONNECT_TIMEOUT):
    """ray, connected: to `address` (HOST:PORT of a head node, ray://HOST:PORT, "auto" for a cluster
    on this machine), or a new local cluster (None, "local"; $RAY_ADDRESS wins). An address that does
    not answer, or answers but does not let Ray join within `timeout` seconds, is a ClusterUnreachable,
    not a hang (ray.init keeps retrying for minutes: it runs in a thread the driver stops waiting for)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    local = address in (None, "", "local")
    t0 = time.monotonic()
    if not local and address != "auto":
        _probe(address, timeout)
    init = lambda: ray.init(address=None if local else address, include_dashboard=False,  # noqa: E731
                            log_to_driver=False, logging_level=logging.WARNING,
                            **({"_system_config": RAY_SYSTEM_CONFIG} if local else {}))
    try:
        if local:                    # a cluster this process starts: no address to wait on
            init()
        else:
            _bounded(init, max(1.0, timeout - (time.monotonic() - t0)), address, timeout)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise ClusterUnreachable(f"cannot connect to the Ray cluster at {address}: {_first_line(e)}") from None
    return ray


def _bounded(init, left: float, address: str, timeout: float) -> None:
    """init() in a daemon thread, waited on for `left` seconds (Ray's own retries outlast any user)."""
    box: dict = {}

    def run():
        try:
            init()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    quiet = _NotMainThreadFilter()
    logging.getLogger("ray._private.worker").addFilter(quiet)
    try:
        th = threading.Thread(target=run, name="ray-connect", daemon=True)
        th.start()
        th.join(left)
    finally:
        logging.getLogger("ray._private.worker").removeFilter(quiet)
    if th.is_alive():
        raise ClusterUnreachable(f"cannot connect to the Ray cluster at {address}: its port answers but Ray did not "
                                 f"join within {timeout:g} s; is it a Ray head (`ray start --head` prints the "
                                 f"address), reachable both ways? (--ray-timeout raises the wait)")
    if "error" in box:
        raise box["error"]


class _NotMainThreadFilter(logging.Filter):
    """Ray's warning that a driver connected off the main thread sets no SIGTERM handler: expected here."""

    def filter(self, record):
        return "not the main thread" not in record.getMessage()


def _probe(address: str, timeout: float) -> None:
    client = address.startswith("ray://")
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or "]" in port:                 # no port (an IPv6 address in brackets has colons)
        host, port = hostport, ""
    try:
        port_n = int(port) if port else (CLIENT_PORT if client else DEFAULT_PORT)
    except ValueError:
        raise InvalidArgument(f"--ray {address!r}: expected HOST:PORT, ray://HOST:PORT, auto or local") from None
    try:
        socket.create_connection((host.strip("[]"), port_n), timeout=timeout).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ClusterUnreachable(f"cannot reach the Ray cluster at {address}: {why} within {timeout:g} s; start "
                                 f"one there with `ray start --head`, or check the address") from None


def _initialized() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _reap(pid: int) -> bool:
    """SIGKILL a hung stage's process, run as a Ray task on its node; only a Ray worker's (its title)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if not fh.read().startswith(b"ray::"):
                return False
        os.kill(pid, signal.SIGKILL)
        return True
    except OSError:
        return False


class _Hung(Exception):
    """A chunk's wait ran out (Pipeline._hung names the stage)."""


def place(n_stages: int, nodes: list[str], placement: str = "spread", warn: bool = True) -> list[str]:
    """The node of each stage: one each when there are as many nodes, else round robin (spread) or a
    ClusterError saying how many there are (strict)."""
    if not nodes:
        raise ClusterError("the Ray cluster has no alive node")
    if len(nodes) < n_stages:
        msg = f"{n_stages} stages, one per node, but the Ray cluster has {len(nodes)} node{'s' * (len(nodes) > 1)}"
        if placement == "strict":
            raise ClusterError(f"{msg}: add nodes (`ray start --address HEAD:PORT` on each), lower --stages, or "
                               f"--placement spread to let stages share nodes")
        if warn:
            log.warning("%s: stages share nodes (round robin)", msg)
    return [nodes[i % len(nodes)] for i in range(n_stages)]


class Pipeline:
    """A model split into `stages` layer ranges, each a Ray actor under its own budget (stage_ram: one
    size for all or one per stage), its own KV cache, restarted by Ray up to max_restarts times.

    ranges: explicit layer ranges (default: split by bytes, cluster.split). stage_models: each stage's
    path or name of the model (default: the driver's); every one must have the driver's sha256.
    placement: "spread" puts one stage per node (the stages share nodes, round robin, when there are
    fewer), "strict" refuses fewer nodes than stages. stage_timeout: the seconds a chunk may take
    through the stages before the one still computing it is declared hung (StageFailed) and restarted.
    runtime_env: the stage actors' Ray runtime environment (env_vars, ...)."""

    generate = Engine.generate                 # the single-process loop: same sampling, same timings
    _prompt_logits = Engine._prompt_logits

    def __init__(self, model: str, stages: int = 2, stage_ram=None, *, address: str | None = None,
                 n_ctx: int | None = None, io: str = "direct", n_threads: int | None = None,
                 ranges: list[tuple[int, int]] | None = None, batch: int | None = None,
                 stage_models: list[str] | None = None, max_restarts: int = 1,
                 connect_timeout: float = CONNECT_TIMEOUT, start_timeout: float = 600.0,
                 stage_timeout: float = STAGE_TIMEOUT, placement: str = "spread", runtime_env: dict | None = None):
        from ..tokenizer import load_tokenizer

        t0 = time.perf_counter()
        self.path = str(resolve_model(model))
        with GGUFFile(self.path) as f:
            self.cluster_plan = cp = plan_stages(f, stages, stage_ram, n_ctx, ranges, batch)
            self.tokenizer = load_tokenizer(f.metadata)
        if stage_models is not None and len(stage_models) != len(cp.stages):
            raise InvalidArgument(f"{len(stage_models)} stage models for {len(cp.stages)} stages")
        if placement not in PLACEMENTS:
            raise InvalidArgument(f"placement {placement!r}: expected one of {', '.join(PLACEMENTS)}")
        if not stage_timeout > 0:
            raise InvalidArgument(f"stage_timeout {stage_timeout!r}: expected seconds above 0")
        self.start_timeout, self.stage_timeout = start_timeout, float(stage_timeout)
        self._owns_ray = not _initialized()           # a local cluster this pipeline starts, it stops
        self.actors: list = []
        self.ray = connect(address, connect_timeout)
        self.batch = min(s.plan.batch for s in cp.stages)      # one chunk size through every stage
        try:
            self._start(model, stage_models, n_ctx, io, n_threads, max_restarts, start_timeout, placement,
                        runtime_env)
        except BaseException:
            self._kill()
            raise
        first = self.infos[0]
        self.hp = SimpleNamespace(n_vocab=cp.n_vocab, n_embd=cp.n_embd, n_layer=cp.n_layer)
        self.n_ctx, self.ubatch = first["n_ctx"], UBATCH
        self.tokens: list[int] = []
        self._prompt: tuple | list = []
        self.state = SimpleNamespace(prompt_logits=np.zeros(cp.n_vocab, np.float32))
        self.timings = Timings(load_s=time.perf_counter() - t0)
        self._load_compile_s = 0.0
        self._dirty = False                    # a request failed: stages recover before the next one

    def _start(self, model, stage_models, n_ctx, io, n_threads, max_restarts, start_timeout, placement,
               runtime_env) -> None:
        """The stage actors, one per node (placement), each checked against the driver's identity."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cp, expect = self.cluster_plan, identity(self.path)
        here = str(Path(model).expanduser().resolve()) if Path(model).expanduser().is_file() else model
        nodes = place(len(cp.stages), self._nodes(), placement, warn=not self._owns_ray)
        remote = self.ray.remote(Stage)
        env = {**(runtime_env or {}), "env_vars": {**STAGE_ENV, **(runtime_env or {}).get("env_vars", {})}}
        self.actors = [remote.options(num_cpus=0, max_restarts=max_restarts, max_task_retries=0,
                                      scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[s.index], soft=False),
                                      runtime_env=env).remote(
            s.index, (stage_models or [here] * len(cp.stages))[s.index], s.layers, s.budget, n_ctx, io, n_threads,
            expect, self.batch) for s in cp.stages]
        self._ids = {a._actor_id.hex(): i for i, a in enumerate(self.actors)}
        self.infos = self._get([a.info.remote() for a in self.actors], start_timeout, "starting")

    def _nodes(self) -> list[str]:
        """The alive nodes' ids, the driver's last (the last stage's logits row then stays on its node)."""
        mine = self.ray.get_runtime_context().get_node_id()
        ids = sorted((n["NodeID"] for n in self.ray.nodes() if n.get("Alive")), key=lambda i: (i == mine, i))
        return ids

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    @property
    def layers(self) -> tuple[int, int]:
        return 0, self.hp.n_layer

    def reset(self, n_past: int = 0) -> None:
        """Forget positions from n_past on; the stages rewind at their next chunk (Stage.forward)."""
        del self.tokens[max(0, n_past):]
        if self._prompt and len(self._prompt[0]) > len(self.tokens):
            self._prompt = []

    def eval(self, tokens, all_logits: bool = False, aligned: bool = False, as_batch: bool = False,
             outputs_all: bool = False) -> np.ndarray:
        """As Engine.eval: the chunks flow through the stages, up to IN_FLIGHT_PER_STAGE per stage ahead."""
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if toks.size == 0:
            raise EmptyPrompt("eval needs at least one token")
        if self.n_past + toks.size > self.n_ctx:
            raise ContextLengthExceeded(f"{self.n_past} cached + {toks.size} new tokens exceed the context of "
                                        f"{self.n_ctx}")
        check_token_ids(toks, self.hp.n_vocab)
        if self._dirty:
            self._recover()
        base, out, flying = self.n_past, [], deque()
        window = IN_FLIGHT_PER_STAGE * len(self.actors)
        try:
            for c in chunks(toks.size, base, self.batch, self.ubatch, all_logits=all_logits, aligned=aligned,
                            as_batch=as_batch, outputs_all=outputs_all):
                x, refs = toks[c.start:c.stop], []
                for a in self.actors:
                    x = a.forward.remote(x, base + c.start, c)
                    refs.append(x)
                flying.append(refs)
                if len(flying) >= window:
                    out.append(self._chunk_result(flying.popleft()))
            while flying:
                out.append(self._chunk_result(flying.popleft()))
        except BaseException as e:
            self._dirty = True                 # the stages may be anywhere: rewind everything
            self.tokens.clear()
            self._prompt = []
            if isinstance(e, StageFailed):
                self._release_survivors(e.stage)
            raise
        self.tokens.extend(int(t) for t in toks)
        return np.concatenate([o for o in out if o is not None])

    def _chunk_result(self, refs):
        try:
            return self._get([refs[-1]], self.stage_timeout, "generating", refs)[0]
        except _Hung:
            raise self._hung(refs) from None

    def _hung(self, chain) -> StageFailed:
        """The first stage of `chain` whose call has not returned, killed on its node (Ray restarts it;
        its charges go with its process), so the calls queued behind it on the others fail and they
        can recover. ray.kill alone waits on the stuck process's answer, and ray.cancel of a call
        waiting on another's result aborts the driver (Ray 2.40): a task on its node sends SIGKILL."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ready, _ = self.ray.wait(list(chain), num_returns=len(chain), timeout=0)
        i = next((k for k, r in enumerate(chain) if r not in ready), len(chain) - 1)
        info = self.infos[i]
        try:
            reap = self.ray.remote(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                info["node_id"], soft=False))(_reap)
            if not self.ray.get(reap.remote(info["pid"]), timeout=60):
                raise ProcessLookupError
        except Exception:  # noqa: BLE001 - its node is gone too, or the pid is no stage: Ray's own kill
            log.warning("stage %d: no process %s to kill on its node; asking Ray", i, info["pid"])
            try:
                self.ray.kill(self.actors[i], no_restart=False)
            except Exception:  # noqa: BLE001 - already gone
                pass
        a, b = self.cluster_plan.stages[i].layers
        return StageFailed(f"stage {i} (layers {a}-{b - 1}) did not answer within {self.stage_timeout:g} s "
                           f"(--stage-timeout); the request is aborted, the stage restarted, the others reset",
                           stage=i)

    def _get(self, refs, timeout, doing: str, chain=None):
        """ray.get with Ray's failures as ramforge's: a stage's own typed error as it is, a dead or
        unreachable stage as StageFailed naming it (the first failing stage of `chain`, upstream first)."""
        ray = self.ray
        from ray import exceptions as rx

        try:
            return ray.get(refs, timeout=timeout)
        except rx.GetTimeoutError:
            if chain is not None:
                raise _Hung() from None
            raise ClusterError(f"the stages did not answer within {timeout:g} s while {doing} (does the cluster "
                               f"have the nodes and memory? `ray status` shows them)") from None
        except rx.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, RamforgeError):
                raise cause from None
            if not isinstance(e, rx.RayActorError):
                raise StageFailed(f"a stage failed while {doing}: {_first_line(e)}") from None
            err = e
        except rx.RayActorError as e:          # died, unavailable (restarting)
            err = e
        except rx.ObjectLostError as e:
            err = e
        i = self._culprit(err, chain)
        where = f"stage {i} (layers {self.cluster_plan.stages[i].layers[0]}-{self.cluster_plan.stages[i].layers[1] - 1})" \
            if i is not None else "a stage"
        raise StageFailed(f"{where} failed while {doing}: {type(err).__name__}; the request is aborted, the other "
                          f"stages reset, Ray restarts it for the next request", stage=i) from None

    def _culprit(self, err, chain) -> int | None:
        i = self._ids.get(getattr(err, "actor_id", None) or "")
        if i is not None or not chain:
            return i
        for i, ref in enumerate(chain):        # an upstream failure fails every stage after it
            try:
                self.ray.get(ref, timeout=5)
            except Exception:  # noqa: BLE001 - this stage's call is the first that failed
                return i
        return None

    def _release_survivors(self, failed: int | None) -> None:
        """Right after a stage failed: the others return what a pass held and drop their positions
        (best effort; the next request recovers every stage again)."""
        refs = [a.recover.remote() for i, a in enumerate(self.actors) if i != failed]
        try:
            self.ray.get(refs, timeout=30)
        except Exception:  # noqa: BLE001 - reported by the next request's recovery
            log.warning("a stage did not recover after stage %s failed", failed)

    def _recover(self) -> None:
        """Rewind every stage after a failed request; a restarted stage comes back empty (its load
        reruns), one still down fails this request too."""
        self._await_restarts()
        charged = self._get([a.recover.remote() for a in self.actors], self.start_timeout, "recovering")
        self.infos = self._get([a.info.remote() for a in self.actors], self.start_timeout, "recovering")
        for info, c in zip(self.infos, charged):
            if c != info["idle"]:
                log.warning("stage %d holds %d B after recovering, %d B idle", info["stage"], c, info["idle"])
        self._dirty = False

    def _await_restarts(self) -> None:
        """Wait (up to start_timeout) for stages Ray is restarting: a call to one answers
        ActorUnavailableError until its reload is done; one dead for good is a StageFailed."""
        from ray import exceptions as rx

        deadline = time.monotonic() + self.start_timeout
        for i, a in enumerate(self.actors):
            while True:
                try:
                    self.ray.get(a.ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
                    break
                except (rx.ActorUnavailableError, rx.GetTimeoutError):
                    if time.monotonic() > deadline:
                        raise StageFailed(f"stage {i} did not come back within {self.start_timeout:g} s", stage=i) \
                            from None
                    time.sleep(0.25)
                except rx.RayActorError:
                    raise StageFailed(f"stage {i} is dead and out of restarts (max_restarts); reload the model",
                                      stage=i) from None

    def stage_info(self) -> list[dict]:
        """Each stage's node, layers, verdict and budget books, asked now."""
        self.infos = self._get([a.info.remote() for a in self.actors], 60.0, "asking the stages")
        return self.infos

    def close(self) -> None:
        try:
            self.ray.get([a.close.remote() for a in self.actors], timeout=30)
        except Exception:  # noqa: BLE001 - the actors are killed below either way
            pass
        self._kill()

    def _kill(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        if self._owns_ray:
            self.ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
