"""Timeline probes for ``call_timeline.py``: on ``PYTHONPATH`` with
``SYNK_TRACE_DIR`` set, every Python process (the master and the workers it
spawns) wraps chosen Synkhronos functions as their modules are imported and
records ``(name, start ns, end ns)`` of each run (``time.perf_counter_ns``, one
clock for every process of the machine), written to ``SYNK_TRACE_DIR`` as
``trace-<pid>.json`` when the process ends (a worker: when it stops serving).
Not part of the package; a probe costs about a microsecond per run."""
import os
import sys

_DIR = os.environ.get("SYNK_TRACE_DIR")
if _DIR:
    import atexit
    import functools
    import importlib.abc
    import importlib.machinery
    import json
    import time

    _now = time.perf_counter_ns
    EVENTS = []
    _TARGETS = {
        "synkhronos._function": [("Function.__call__", "call"), ("run_share_reduced", "share_reduced"),
                                 ("plan_call", "plan"), ("take_reduced", "take_reduced"),
                                 ("device_reduction", "device_reduction"),
                                 ("Function._check_datas", "check_datas")],
        "synkhronos._call.share": [("_run_whole", "run_whole"), ("run_share", "run_share"),
                                   ("share_rows", "share_rows")],
        "synkhronos._call.plan": [("CallPlan.messages", "messages"), ("CallPlan.master_args", "master_args")],
        "synkhronos._session.dispatch": [("Dispatcher._deliver", "deliver"), ("Dispatcher._reply", "reply"),
                                         ("Dispatcher._settle", "settle"), ("Dispatcher.request", "request")],
        "synkhronos._api": [("synchronize", "call_sync")],
        "synkhronos._session.handlers": [("run_share_reduced", "share_reduced"), ("_on_call", "on_call"),
                                         ("_on_collective", "on_collective"), ("_on_sync", "on_sync")],
        "synkhronos._collectives.reducing": [("all_reduce", "call_all_reduce")],
        "synkhronos._collectives.transfer": [("device_collective", "device_collective")],
        "synkhronos._devices.gpu._collectives": [("CollectivesMixin.all_reduce", "dev_all_reduce"),
                                                 ("CollectivesMixin._input", "input"),
                                                 ("CollectivesMixin._outputs", "outputs"),
                                                 ("CollectivesMixin._to_cupy", "to_cupy")],
        "synkhronos._wire.channel": [("ShmChannel.send", "send"), ("ShmChannel.recv", "recv"),
                                     ("SocketChannel.send", "send"), ("SocketChannel.recv", "recv")],
        "synkhronos._wire.protocol": [("from_wire", "from_wire")],
        "synkhronos._devices.gpu._outputs": [("OutputsMixin.reduce_outputs", "reduce_outputs"),
                                             ("OutputsMixin.take_outputs", "take_outputs"),
                                             ("OutputsMixin._output_pointer", "output_pointer"),
                                             ("OutputsMixin._queue_host_copies", "host_copies")],
        "synkhronos._devices.gpu._stream": [("StreamMixin.synchronize", "dev_sync"),
                                            ("StreamMixin._wait", "stream_wait"),
                                            ("StreamMixin._wait_for", "wait_for"),
                                            ("StreamMixin._retire", "retire")],
        "synkhronos._devices.gpu._values": [("ValuesMixin.to_host", "to_host")],
        "synkhronos._session.worker": [("serve_commands", None)],
    }

    def _wrap(fn, name):
        @functools.wraps(fn)
        def traced(*a, **k):
            t0 = _now()
            try:
                return fn(*a, **k)
            finally:
                EVENTS.append((name, t0, _now()))
        traced.__synk_traced__ = True
        return traced

    def dump():
        path = os.path.join(_DIR, "trace-%d.json" % os.getpid())
        with open(path, "w") as f:
            json.dump({"pid": os.getpid(), "argv": sys.argv[:2], "events": EVENTS}, f)

    def _patch(mod):
        for attr, name in _TARGETS.get(mod.__name__, ()):
            owner, parts = mod, attr.split(".")
            try:
                for p in parts[:-1]:
                    owner = getattr(owner, p)
                fn = getattr(owner, parts[-1])
            except AttributeError:
                continue
            if name is None:  # worker: dump before os._exit
                def serve(*a, _fn=fn, **k):
                    try:
                        return _fn(*a, **k)
                    finally:
                        dump()
                setattr(owner, parts[-1], serve)
                continue
            if getattr(fn, "__synk_traced__", False):
                continue
            setattr(owner, parts[-1], _wrap(fn, name))
        if mod.__name__ == "synkhronos._session.handlers":
            for cmd, h in list(mod.HANDLERS.items()):
                new = getattr(mod, getattr(h, "__name__", ""), h)
                if new is not h:
                    mod.HANDLERS[cmd] = new

    class _Loader(importlib.abc.Loader):
        def __init__(self, inner):
            self.inner = inner

        def create_module(self, spec):
            return self.inner.create_module(spec)

        def exec_module(self, module):
            self.inner.exec_module(module)
            _patch(module)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname not in _TARGETS:
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
            return spec

    sys.meta_path.insert(0, _Finder())
    atexit.register(dump)
