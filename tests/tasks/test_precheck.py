"""The static precheck: one cheating candidate per rule, each refused with its exact class and a
reason naming the line; every reference kernel and a few honest tricks pass untouched."""

import textwrap
import time
from pathlib import Path

import pytest

from tasks.precheck import precheck, reference_ops

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "data" / "problems" / "smoke"
RELU, GELU, MATMUL, LINEAR_RELU = (
    (SMOKE / f"{name}.py").read_text() for name in ("1_relu", "1_gelu", "1_matmul", "2_linear_relu")
)
REFERENCE_KERNELS = sorted(p for p in (ROOT / "kernels_ref").glob("*/*.py") if (SMOKE / p.name).exists())

KERNEL = '''
from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cstdint>
extern "C" void relu(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
""")
'''


def candidate(forward: str, prelude: str = "", init: str = "pass") -> str:
    """A ModelNew whose __init__ runs `init` and whose forward(self, x, *rest) runs `forward`;
    `prelude` goes at module level after the torch imports. Line 3 is the prelude's first line."""
    return (
        "import torch\nimport torch.nn as nn\n"
        + textwrap.dedent(prelude).strip()
        + "\n\n\nclass ModelNew(nn.Module):\n    def __init__(self, *args):\n        super().__init__()\n"
        + textwrap.indent(textwrap.dedent(init).strip(), " " * 8)
        + "\n\n    def forward(self, x, *rest):\n"
        + textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
        + "\n"
    )


def honest(forward: str = "y = torch.empty_like(x)\nlib.relu(x, y, x.numel())\nreturn y", **parts) -> str:
    return candidate(forward, prelude=KERNEL + parts.pop("prelude", ""), **parts)


def line_of(source: str, text: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if text in line)


# (problem, candidate, error_class, the construct the reason names); the line is found from the marker text
CHEATS = {
    # imports
    "subprocess": (RELU, candidate("return x", "import subprocess"), "forbidden_import", "imports subprocess"),
    "socket": (RELU, candidate("return x", "import socket as s"), "forbidden_import", "imports socket"),
    "multiprocessing": (
        RELU,
        candidate("return x", "from multiprocessing import Pool"),
        "forbidden_import",
        "imports multiprocessing",
    ),
    "urllib": (RELU, candidate("return x", "import urllib.request"), "forbidden_import", "imports urllib.request"),
    "http": (RELU, candidate("return x", "import http.client"), "forbidden_import", "imports http.client"),
    "requests": (RELU, candidate("return x", "import requests"), "forbidden_import", "imports requests"),
    "asyncio": (RELU, candidate("return x", "from asyncio import subprocess"), "forbidden_import", "imports asyncio"),
    "signal": (RELU, candidate("return x", "import signal"), "forbidden_import", "imports signal"),
    "pty": (RELU, candidate("return x", "import pty"), "forbidden_import", "imports pty"),
    "shutil": (RELU, candidate("return x", "import shutil"), "forbidden_import", "imports shutil"),
    "pickle": (RELU, candidate("return x", "import pickle"), "forbidden_import", "imports pickle"),
    "marshal": (RELU, candidate("return x", "from marshal import loads"), "forbidden_import", "imports marshal"),
    "importlib": (RELU, candidate("return x", "import importlib"), "forbidden_import", "imports importlib"),
    "ctypes": (RELU, candidate("return x", "import ctypes"), "forbidden_import", "through kforge.kernels"),
    "kforge_config": (RELU, candidate("return x", "from kforge import config"), "forbidden_import", "kforge.config"),
    "kforge_results": (RELU, candidate("return x", "import kforge.results"), "forbidden_import", "kforge.results"),
    "tasks": (RELU, candidate("return x", "from tasks.harness import timing"), "forbidden_import", "tasks.harness"),
    # processes, environment, dynamic code
    "os_system": (RELU, candidate("os.system('true')\nreturn x", "import os"), "process_or_network", "os.system"),
    "os_popen": (RELU, candidate("return x", "import os\nos.popen('ls')"), "process_or_network", "os.popen"),
    "os_exec": (RELU, candidate("os.execv('/bin/true', [''])", "import os"), "process_or_network", "os.execv"),
    "os_spawn": (RELU, candidate("os.spawnl(0, 'true')", "import os"), "process_or_network", "os.spawnl"),
    "os_fork": (RELU, candidate("os.fork()\nreturn x", "import os"), "process_or_network", "os.fork"),
    "os_kill": (RELU, candidate("os.kill(1, 9)\nreturn x", "import os"), "process_or_network", "os.kill"),
    "os_exit": (RELU, candidate("os._exit(0)", "import os"), "process_or_network", "os._exit"),
    "from_os_import": (RELU, candidate("return x", "from os import system"), "process_or_network", "os.system"),
    "sys_exit": (RELU, candidate("sys.exit(0)", "import sys"), "process_or_network", "sys.exit"),
    "exit": (RELU, candidate("exit(0)"), "process_or_network", "builtins.exit"),
    "quit": (RELU, candidate("quit()"), "process_or_network", "builtins.quit"),
    "environ": (RELU, candidate("k = os.environ['KEY']\nreturn x", "import os"), "environment", "os.environ"),
    "getenv": (RELU, candidate("k = os.getenv('KEY')\nreturn x", "import os"), "environment", "os.getenv"),
    "environ_store": (
        RELU,
        candidate("return x", "import os\nos.environ['OMP_NUM_THREADS'] = '64'"),
        "environment",
        "assigns to os.environ",
    ),
    "load_library": (
        RELU,
        candidate("return x", "torch.ops.load_library('/tmp/x.so')"),
        "dynamic_code",
        "torch.ops.load_library",
    ),
    "dunder_import": (RELU, candidate("__import__('os')\nreturn x"), "dynamic_code", "builtins.__import__"),
    "eval": (RELU, candidate("return eval('x')"), "dynamic_code", "builtins.eval"),
    "exec": (RELU, candidate("exec('y = 1')\nreturn x"), "dynamic_code", "builtins.exec"),
    "compile": (RELU, candidate("c = compile('1', 'f', 'eval')\nreturn x"), "dynamic_code", "builtins.compile"),
    "getattr_os": (
        RELU,
        candidate("getattr(os, 'system')('ls')\nreturn x", "import os"),
        "process_or_network",
        "uses os.system",
    ),
    # files
    "open": (RELU, candidate("cached = open('/tmp/out.pt', 'rb')\nreturn x"), "file_access", "builtins.open"),
    "io_open": (RELU, candidate("io.open('/tmp/out')\nreturn x", "import io"), "file_access", "io.open"),
    "read_text": (
        RELU,
        candidate("Path('r').read_text()\nreturn x", "from pathlib import Path"),
        "file_access",
        ".read_text()",
    ),
    "write_bytes": (
        RELU,
        candidate("pathlib.Path('r').write_bytes(b'')\nreturn x", "import pathlib"),
        "file_access",
        ".write_bytes()",
    ),
    "os_remove": (RELU, candidate("os.remove('f')\nreturn x", "import os"), "file_access", "os.remove"),
    "os_listdir": (RELU, candidate("os.listdir('.')\nreturn x", "import os"), "file_access", "os.listdir"),
    "os_walk": (RELU, candidate("list(os.walk('.'))\nreturn x", "import os"), "file_access", "os.walk"),
    "glob": (RELU, candidate("glob.glob('*')\nreturn x", "import glob"), "file_access", "glob.glob"),
    "torch_load": (RELU, candidate("return torch.load('cached.pt')"), "file_access", "torch.load"),
    # tampering with the harness
    "allclose": (
        RELU,
        candidate("return x", "torch.allclose = lambda *a, **k: True"),
        "harness_tampering",
        "torch.allclose",
    ),
    "perf_counter": (
        RELU,
        candidate("return x", "import time as clock\nclock.perf_counter = lambda: 0.0"),
        "harness_tampering",
        "assigns to time.perf_counter",
    ),
    "elapsed_time": (
        RELU,
        candidate("return x", "torch.cuda.Event.elapsed_time = lambda self, end: 1e-3"),
        "harness_tampering",
        "torch.cuda.Event.elapsed_time",
    ),
    "tensor_eq": (
        RELU,
        candidate("return x", "torch.Tensor.__eq__ = lambda a, b: True"),
        "harness_tampering",
        "torch.Tensor.__eq__",
    ),
    "aliased_class": (
        RELU,
        candidate("return x", "T = torch.Tensor\nT.__eq__ = lambda a, b: True"),
        "harness_tampering",
        "torch.Tensor.__eq__",
    ),
    "from_import": (
        RELU,
        candidate("return x", "from torch.cuda import Event\nEvent.elapsed_time = None"),
        "harness_tampering",
        "torch.cuda.Event.elapsed_time",
    ),
    "setattr": (
        RELU,
        candidate("return x", "setattr(torch, 'allclose', lambda *a, **k: True)"),
        "harness_tampering",
        "setattr() on torch",
    ),
    "delattr": (RELU, candidate("return x", "import gc\ndelattr(gc, 'collect')"), "harness_tampering", "delattr()"),
    "builtins": (
        RELU,
        candidate("return x", "import builtins\nbuiltins.len = None"),
        "harness_tampering",
        "builtins.len",
    ),
    "numpy": (
        RELU,
        candidate("return x", "import numpy as np\nnp.allclose = None"),
        "harness_tampering",
        "numpy.allclose",
    ),
    "del_torch": (RELU, candidate("return x", "del torch.testing"), "harness_tampering", "torch.testing"),
    "sys_modules": (
        RELU,
        candidate("return x", "import sys\nsys.modules['torch']"),
        "harness_tampering",
        "sys.modules",
    ),
    "gc_objects": (RELU, candidate("gc.get_objects()\nreturn x", "import gc"), "harness_tampering", "gc.get_objects"),
    "inspect_stack": (
        RELU,
        candidate("inspect.stack()\nreturn x", "import inspect"),
        "harness_tampering",
        "inspect.stack",
    ),
    "getframe": (RELU, candidate("sys._getframe(1)\nreturn x", "import sys"), "harness_tampering", "sys._getframe"),
    "dunder_builtins": (RELU, candidate("__builtins__['open']\nreturn x"), "harness_tampering", "__builtins__"),
    "poison_off": (
        RELU,
        candidate("torch.use_deterministic_algorithms(False)\nreturn x"),
        "harness_tampering",
        "torch.use_deterministic_algorithms",
    ),
    # the reference's own ops
    "torch_relu": (RELU, candidate("return torch.relu(x)"), "reference_op", "calls torch.relu: relu"),
    "functional": (
        RELU,
        candidate("return F.relu(x)", "import torch.nn.functional as F"),
        "reference_op",
        "torch.nn.functional.relu",
    ),
    "from_functional": (
        RELU,
        candidate("return r(x)", "from torch.nn.functional import relu as r"),
        "reference_op",
        "calls torch.nn.functional.relu",
    ),
    "tensor_method": (RELU, candidate("return x.relu()"), "reference_op", "the tensor method .relu()"),
    "in_place": (RELU, candidate("return x.clone().relu_()"), "reference_op", ".relu_()"),
    "new_layer": (RELU, candidate("return nn.ReLU()(x)"), "reference_op", "a new nn.ReLU"),
    "alias": (RELU, candidate("return fn(x)", "fn = torch.relu"), "reference_op", "torch.relu"),
    "reference": (RELU, candidate("return list(map(torch.relu, [x]))[0]"), "reference_op", "refers to torch.relu"),
    "getattr_op": (RELU, candidate("return getattr(torch, 'relu')(x)"), "reference_op", "torch.relu"),
    "except_fallback": (
        RELU,
        honest(
            "try:\n    y = torch.empty_like(x)\n    lib.relu(x, y, x.numel())\nexcept Exception:\n    y = torch.relu(x)"
        ),
        "reference_op",
        "in an except handler",
    ),
    "helper_function": (
        RELU,
        candidate("return _go(x)", "def _go(x):\n    return x.relu()"),
        "reference_op",
        ".relu()",
    ),
    "init": (
        RELU,
        candidate("return self.f(x)", init="self.f = lambda t: torch.relu(t)"),
        "reference_op",
        "torch.relu",
    ),
    "matmul": (MATMUL, candidate("return torch.matmul(x, rest[0])"), "reference_op", "torch.matmul"),
    "matmul_operator": (MATMUL, candidate("return x @ rest[0]"), "reference_op", "the @ operator"),
    "mm_method": (MATMUL, candidate("return x.mm(rest[0])"), "reference_op", ".mm(): mm"),
    "einsum": (MATMUL, candidate("return torch.einsum('ik,kj->ij', x, rest[0])"), "reference_op", "einsum"),
    "numpy_matmul": (
        MATMUL,
        candidate("return torch.from_numpy(np.matmul(x.numpy(), rest[0].numpy()))", "import numpy as np"),
        "reference_op",
        "numpy.matmul",
    ),
    "self_layer": (
        LINEAR_RELU,
        candidate("return self.linear(x).clamp(min=0)", init="self.linear = nn.Linear(*args)"),
        "reference_op",
        "self.linear (an nn.Linear)",
    ),
    "layer_forward": (
        LINEAR_RELU,
        candidate("return self.fc.forward(x).clamp(min=0)", init="self.fc = nn.Linear(*args)"),
        "reference_op",
        "self.fc (an nn.Linear)",
    ),
    "sequential": (
        LINEAR_RELU,
        candidate("return self.net(x)", init="self.net = nn.Sequential(nn.Linear(*args), nn.ReLU())"),
        "reference_op",
        "self.net",
    ),
    "addmm": (
        LINEAR_RELU,
        candidate("return torch.addmm(self.b, x, self.w.t())", init="self.w = nn.Parameter(torch.randn(*args))"),
        "reference_op",
        "torch.addmm",
    ),
    "layer_call": (GELU, candidate("return self.act(x)", init="self.act = nn.GELU()"), "reference_op", "self.act"),
}


# Reaching the harness's state through frames, function internals, namespaces, the class graph or
# torch's dispatch-mode state (INTEGRITY.md rows 12 and 14): all harness_tampering, one per line:
# (prelude, forward, what the reason names, text found only on the refused line)
REACHING_IN = {
    "traceback_frame_chain": (
        "",
        "try:\n    1 / 0\nexcept Exception as e:\n    s = e.__traceback__.tb_frame.f_back.f_locals['secret']",
        "uses .__traceback__: frames and tracebacks",
        "secret",
    ),
    "exc_info_tb_frame": ("import sys", "f = sys.exc_info()[2].tb_frame", "uses .tb_frame", "f = sys"),
    "tb_next": ("", "try:\n    1 / 0\nexcept Exception as e:\n    t = e.__traceback__", ".__traceback__", "t = e"),
    "f_globals": ("", "g = self.frame.f_globals", "uses .f_globals", "g = self"),
    "f_code": ("", "c = self.frame.f_code", "uses .f_code", "c = self"),
    "helper_globals": (
        "from kforge.kernels import load_cpp",
        "fd = load_cpp.__globals__['os'].open('/tmp/out', 0)",
        "uses .__globals__: a function's globals",
        "fd = load_cpp",
    ),
    "code_object": ("def _go():\n    return 1", "k = _go.__code__.co_consts", "uses .__code__", "k = _go"),
    "closure": ("def _go():\n    return 1", "cell = _go.__closure__[0]", "uses .__closure__", "cell = _go"),
    "cell_contents": ("", "v = self.cell.cell_contents", "uses .cell_contents", "v = self"),
    "co_consts": ("", "v = self.code.co_consts", "uses .co_consts", "v = self"),
    "wrapped": ("", "f = self.timed.__wrapped__", "uses .__wrapped__", "f = self"),
    "generator_frame": ("", "up = (i for i in ()).gi_frame.f_back", "uses .gi_frame", "up = "),
    "coroutine_frame": ("", "up = self.coro.cr_frame", "uses .cr_frame", "up = "),
    "async_generator_frame": ("", "up = self.agen.ag_frame", "uses .ag_frame", "up = "),
    "module_dict": ("", "check = torch.__dict__['allclose']", "uses .__dict__: namespaces", "check = "),
    "class_dict": ("", "d = type(self).__dict__", "uses .__dict__", "d = type"),
    "vars": ("", "check = vars(torch)['allclose']", "uses builtins.vars", "check = "),
    "globals": ("", "b = globals()['__name__']", "uses builtins.globals", "b = globals"),
    "locals": ("", "names = locals()", "uses builtins.locals", "names = "),
    "subclasses": ("", "every = object.__subclasses__()", "uses .__subclasses__", "every = "),
    "mro": ("", "root = type(x).__mro__[-1]", "uses .__mro__", "root = "),
    "mro_method": ("", "root = type(x).mro()[-1]", "uses .mro", "root = "),
    "bases": ("", "up = int.__bases__", "uses .__bases__", "up = "),
    "base": ("", "up = ().__class__.__base__", "uses .__base__", "up = "),
    "module_builtins": ("", "o = torch.__builtins__['open']", "uses .__builtins__", "o = "),
    "self_of_a_builtin": ("", "o = print.__self__.open", "uses .__self__", "o = "),
    "module_loader": ("", "data = torch.__spec__.loader.get_data('/etc/passwd')", "uses .__spec__", "data = "),
    "getattr_string": ("", "t = getattr(self.error, 'tb_frame')", "names 'tb_frame' in a string", "t = "),
    "hasattr_string": ("", "watched = hasattr(self.fn, '__wrapped__')", "names '__wrapped__' in a string", "watched"),
    "attrgetter": (
        "import operator",
        "g = operator.attrgetter('__globals__')(self.fn)",
        "names '__globals__' in a string",
        "g = ",
    ),
    "string_subscript": ("", "o = self.ns['__builtins__']", "names '__builtins__' in a string", "o = "),
    "format_field": (
        "",
        "s = '{0.__traceback__.tb_frame}'.format(self.error)",
        "names .__traceback__ in a format",
        "s = ",
    ),
    "current_frames": ("import sys", "every = sys._current_frames()", "uses sys._current_frames", "every = "),
    "inspect_getmembers": ("import inspect", "m = inspect.getmembers(torch)", "uses inspect.getmembers", "m = "),
    "walk_stack": ("import traceback", "up = list(traceback.walk_stack(None))", "traceback.walk_stack", "up = "),
    "format_stack": ("import traceback", "where = traceback.format_stack()", "traceback.format_stack", "where = "),
    # torch's dispatch-mode and profiler state: is a TorchDispatchMode or the profiler watching?
    "get_dispatch_mode": ("", "watched = torch._C._get_dispatch_mode(None)", "torch._C._get_dispatch_mode", "watched"),
    "dispatch_stack_length": (
        "",
        "watched = torch._C._len_torch_dispatch_stack() > 0",
        "uses torch._C._len_torch_dispatch_stack: torch's dispatch-mode and profiler state",
        "watched",
    ),
    "python_dispatch_mode": (
        "",
        "watched = torch.utils._python_dispatch._get_current_dispatch_mode()",
        "torch.utils._python_dispatch._get_current_dispatch_mode",
        "watched",
    ),
    "from_python_dispatch": (
        "from torch.utils._python_dispatch import _get_current_dispatch_mode",
        "return x",
        "imports torch.utils._python_dispatch._get_current_dispatch_mode",
        "_python_dispatch",
    ),
    "import_python_dispatch": (
        "import torch.utils._python_dispatch as pd",
        "return x",
        "imports torch.utils._python_dispatch",
        "_python_dispatch",
    ),
    "dispatch_mode_class": (
        "from torch.utils._python_dispatch import TorchDispatchMode",
        "return x",
        "torch.utils._python_dispatch.TorchDispatchMode",
        "TorchDispatchMode",
    ),
    "from_torch_c": (
        "from torch._C import _len_torch_dispatch_stack",
        "return x",
        "_len_torch_dispatch_stack",
        "_len_torch",
    ),
    "function_mode_enabled": (
        "",
        "watched = torch._C._is_torch_function_mode_enabled()",
        "torch._C._is_torch_function_mode_enabled",
        "watched",
    ),
    "function_mode_stack": (
        "",
        "watched = torch.overrides._get_current_function_mode_stack()",
        "torch.overrides._get_current_function_mode_stack",
        "watched",
    ),
    "own_function_mode": (
        "class Spy(torch.overrides.TorchFunctionMode):\n    pass",
        "return x",
        "torch.overrides.TorchFunctionMode",
        "class Spy",
    ),
    "dispatch_key_tls": (
        "",
        "watched = torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.Python)",
        "torch._C._dispatch_tls_is_dispatch_key_included",
        "watched",
    ),
    "disable_torch_dispatch": ("", "with torch._C._DisableTorchDispatch():\n    pass", "_DisableTorchDispatch", "with"),
    "profiler_enabled": (
        "",
        "watched = torch.autograd.profiler._is_profiler_enabled",
        "torch.autograd.profiler._is_profiler_enabled",
        "watched",
    ),
    "autograd_profiler_state": (
        "",
        "watched = torch._C._autograd._profiler_enabled()",
        "torch._C._autograd._profiler_enabled",
        "watched",
    ),
}


@pytest.mark.parametrize("name", REACHING_IN)
def test_reaching_the_harness_through_frames_namespaces_or_dispatch_state_is_refused(name):
    prelude, forward, construct, marker = REACHING_IN[name]
    source = honest(forward + "\nreturn x" if "return" not in forward else forward, prelude=prelude)

    result = precheck(source, RELU)

    assert result is not None, f"{name} passed the precheck"
    assert (result["outcome"], result["error_class"]) == ("integrity_violation", "harness_tampering"), result
    assert result["error_excerpt"].startswith(f"line {line_of(source, marker)}: "), (result, marker)
    assert construct in result["error_excerpt"], result
    assert "\n" not in result["error_excerpt"]


@pytest.mark.parametrize("name", CHEATS)
def test_each_cheat_is_refused_with_its_class_and_line(name):
    problem, source, error_class, construct = CHEATS[name]

    result = precheck(source, problem)

    assert result is not None, f"{name} passed the precheck"
    assert (result["outcome"], result["error_class"]) == ("integrity_violation", error_class), result
    assert construct in result["error_excerpt"]
    assert result["error_excerpt"].startswith("line ")
    assert "\n" not in result["error_excerpt"]


def test_the_reason_names_the_line_of_the_construct():
    source = honest("y = torch.empty_like(x)\nlib.relu(x, y, x.numel())\nz = torch.relu(x)\nreturn y")

    result = precheck(source, RELU)

    assert result["error_excerpt"].startswith(f"line {line_of(source, 'z = torch.relu(x)')}: calls torch.relu")


def test_the_first_refused_construct_in_source_order_is_reported():
    source = candidate("os.system('ls')\nreturn torch.relu(x)", "import os\nimport subprocess")

    assert precheck(source, RELU)["error_excerpt"].startswith("line 4: imports subprocess")


@pytest.mark.parametrize("kernel_path", REFERENCE_KERNELS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_reference_kernel_passes(kernel_path):
    assert precheck(kernel_path.read_text(), (SMOKE / kernel_path.name).read_text()) is None


HONEST = {
    "try_around_the_kernel": honest(
        "y = torch.empty_like(x)\ntry:\n    lib.relu(x.contiguous(), y, x.numel())\nexcept RuntimeError:\n"
        "    raise ValueError('kernel failed')\nreturn y"
    ),
    "math_and_a_helper": honest(
        "n = _count(x)\ny = torch.empty_like(x)\nlib.relu(x, y, n)\nreturn y",
        prelude="import math\n\ndef _count(t):\n    return math.prod(t.shape)",
    ),
    "a_method_named_like_the_op": candidate(
        "return self.relu(x)", KERNEL + "\nimport torch.nn.functional as F", init="self.kernel = lib"
    ).replace(
        "    def forward",
        "    def relu(self, x):\n        y = x.new_empty(x.shape)\n"
        "        self.kernel.relu(x, y, x.numel())\n        return y\n\n    def forward",
    ),
    "a_local_named_like_the_op": honest("relu = torch.empty_like(x)\nlib.relu(x, relu, x.numel())\nreturn relu"),
    "parameters_and_shape_ops": honest(
        "y = torch.empty_like(x).view(-1)\nlib.relu(x.reshape(-1).float(), y, x.numel())\nreturn y.view(x.shape)",
        init="self.weight = nn.Parameter(torch.randn(4, 4))\ntorch.manual_seed(0)",
    ),
    "an_os_import_used_for_paths": honest(prelude="import os\nHERE = os.path.dirname('a/b')"),
    "load_inline_like_kernelbench": candidate(
        "return self.relu_module.relu(x)",
        "from torch.utils.cpp_extension import load_inline\n\nrelu_module = load_inline(name='relu', cpp_sources='')",
        init="self.relu_module = relu_module",
    ),
    "a_parameter_named_open": honest(prelude="def _f(open=None):\n    return 1"),
    "reraise_from": honest(
        "y = torch.empty_like(x)\ntry:\n    lib.relu(x, y, x.numel())\nexcept Exception as e:\n"
        "    raise RuntimeError(f'{self.__class__.__name__}: relu failed on {type(x).__name__}') from e\nreturn y"
    ),
    "exception_message": honest(
        "try:\n    return self._run(x)\nexcept RuntimeError as error:\n    raise ValueError(str(error)) from None",
        prelude="import traceback\n\ndef _log():\n    return traceback.format_exc()",
    ),
    "dataclass_and_static_and_class_methods": KERNEL
    + """
import torch
import torch.nn as nn
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Config:
    block: int = 256
    tiles: list = field(default_factory=list)

    @classmethod
    def make(cls):
        return cls()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = Config.make()

    @staticmethod
    def grid(n):
        return (n + 255) // 256

    @property
    def name(self):
        return type(self).__name__

    def forward(self, x):
        y = torch.empty_like(x)
        lib.relu(x, y, min(x.numel(), self.grid(x.numel()) * self.config.block))
        return y
""",
    "strings_that_merely_contain_a_refused_name": honest(
        prelude='SOURCE = "float f_back = 0.f; // __dict__ of the tile"\nNAMES = ["mro_table", "co_constsx"]'
    ),
    "array_interfaces_and_streams": honest(
        "y = torch.empty_like(x)\nptr = y.__cuda_array_interface__ if y.is_cuda else y.__array_interface__\n"
        "stream = torch.cuda.current_stream().cuda_stream if y.is_cuda else 0\nlib.relu(x, y, x.numel())\nreturn y"
    ),
    "a_profiler_label": honest(
        "with torch.profiler.record_function('relu_kernel'):\n    y = torch.empty_like(x)\n"
        "    lib.relu(x, y, x.numel())\nreturn y"
    ),
}


@pytest.mark.parametrize("name", HONEST)
def test_honest_variants_pass(name):
    assert precheck(HONEST[name], RELU) is None


# A candidate as KernelBench's prompt example writes it: CUDA source in a string, load_inline, a module attribute.
KERNELBENCH_ADD = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

elementwise_add_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void elementwise_add_kernel(const float* a, const float* b, float* out, int size) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        out[idx] = a[idx] + b[idx];
    }
}

torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b) {
    auto size = a.numel();
    auto out = torch::zeros_like(a);
    const int block_size = 256;
    const int num_blocks = (size + block_size - 1) / block_size;
    elementwise_add_kernel<<<num_blocks, block_size>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), size);
    return out;
}
"""

elementwise_add_cpp_source = "torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b);"

# Compile the inline CUDA code for element-wise addition
elementwise_add = load_inline(
    name="elementwise_add",
    cpp_sources=elementwise_add_cpp_source,
    cuda_sources=elementwise_add_source,
    functions=["elementwise_add_cuda"],
    verbose=True,
    extra_cflags=[""],
    extra_ldflags=[""],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.elementwise_add = elementwise_add

    def forward(self, a, b):
        return self.elementwise_add.elementwise_add_cuda(a, b)
'''
ADD = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a + b

def get_inputs():
    return [torch.randn(4096), torch.randn(4096)]

def get_init_inputs():
    return []
"""


def test_a_kernelbench_load_inline_candidate_passes():
    assert precheck(KERNELBENCH_ADD, ADD) is None
    as_op = KERNELBENCH_ADD.replace("self.elementwise_add.elementwise_add_cuda", "self.op.elementwise_add_cuda")
    assert precheck(as_op.replace("self.elementwise_add = ", "self.op = "), ADD) is None
    # the same candidate reaching into its extension module's namespace is refused, on its line
    reaching = KERNELBENCH_ADD.replace(
        "return self.elementwise_add", "self.elementwise_add.__dict__\n        return self.elementwise_add"
    )
    assert precheck(reaching, ADD)["error_excerpt"].startswith(f"line {line_of(reaching, '.__dict__')}: uses .__dict__")


def test_a_linear_candidate_may_read_its_layer_weights_but_not_call_the_layer():
    forward = "w, b = self.linear.weight.contiguous(), self.linear.bias\ny = torch.empty(x.shape[0], w.shape[0])\n"
    reads = candidate(forward + "lib.linear_relu(x, w, b, y)\nreturn y", KERNEL, init="self.linear = nn.Linear(*args)")
    calls = reads.replace("lib.linear_relu(x, w, b, y)", "y = self.linear(x)")

    assert precheck(reads, LINEAR_RELU) is None
    assert precheck(calls, LINEAR_RELU)["error_class"] == "reference_op"


def test_triton_kernel_bodies_are_not_torch():
    source = candidate(
        "y = torch.empty_like(x)\nrow_sum[(x.shape[0],)](x, y)\nreturn y",
        "import triton\nimport triton.language as tl\n\n@triton.jit\ndef row_sum(x_ptr, y_ptr):\n"
        "    v = tl.load(x_ptr + tl.arange(0, 16))\n    tl.store(y_ptr, v.sum(axis=0) + tl.sum(v, axis=0))",
    )

    assert precheck(source, (SMOKE / "1_sum_dim.py").read_text()) is None
    assert precheck(
        source.replace("row_sum[(x.shape[0],)](x, y)", "y = x.sum(1)"), (SMOKE / "1_sum_dim.py").read_text()
    )


def test_allow_library_calls_lets_the_reference_op_through_but_nothing_else():
    matmul = candidate("return torch.matmul(x, rest[0])")
    both = candidate("return torch.matmul(x, rest[0])", "import subprocess")

    assert precheck(matmul, MATMUL, allow_library_calls=True) is None
    assert precheck(both, MATMUL, allow_library_calls=True)["error_class"] == "forbidden_import"


def test_reference_ops_resolve_layers_aliases_and_the_gemm_family():
    assert reference_ops(RELU) == {"relu"}
    assert reference_ops(GELU) == {"gelu"}  # self.gelu = nn.GELU(), called in forward
    assert {"matmul", "mm", "addmm", "linear", "relu"} <= reference_ops(LINEAR_RELU)
    assert "empty" not in reference_ops(
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.empty_like(x).copy_(x).view(-1)\n"
    )


@pytest.mark.parametrize(
    ("source", "error_class", "excerpt"),
    [
        ("import torch\ndef forward(x) return x\n", "SyntaxError", "line 2: SyntaxError: expected ':'"),
        ("import torch\n\nx = 1\x00\n", "SyntaxError", "line 3: SyntaxError: source code string cannot contain null"),
        ("x = " + "(" * 1000 + ")" * 1000, "SyntaxError", "line 1: SyntaxError: too many nested parentheses"),
    ],
    ids=["syntax", "nul_byte", "nesting"],
)
def test_a_source_that_does_not_parse_is_a_compile_error(source, error_class, excerpt):
    result = precheck(source, RELU)

    assert (result["outcome"], result["error_class"]) == ("compile_error", error_class)
    assert result["error_excerpt"].startswith(excerpt)


def test_absurdly_deep_expressions_are_a_compile_error_not_a_crash():
    for source in ("x = 1" + " + 1" * 100_000, "x = " + "-" * 100_000 + "1"):
        result = precheck(source, RELU)
        assert result["outcome"] == "compile_error"
        assert result["error_class"] in ("RecursionError", "MemoryError", "SyntaxError")


def test_long_chains_that_parse_are_scanned_without_recursion():
    for chain in ("(1, 2)" * 1200, ".b" * 1200, "[0]" * 1200):
        assert precheck(candidate("return x", "y = f(1, 2)" + chain), RELU) is None
    assert precheck(candidate("return x", "y = torch" + ".a" * 1200 + "\ntorch.allclose = None"), RELU)


def test_no_top_level_model_new_is_the_workers_compile_error():
    nested = "import torch.nn as nn\n\ndef make():\n    class ModelNew(nn.Module):\n        pass\n"

    assert precheck(RELU, RELU)["error_class"] == "no_ModelNew"  # defines Model, not ModelNew
    assert precheck(nested, RELU) == {
        "outcome": "compile_error",
        "error_class": "no_ModelNew",
        "error_excerpt": "the candidate defines no top-level class ModelNew",
    }


def test_a_200_line_candidate_is_checked_in_well_under_50_ms():
    helpers = "".join(
        f"\ndef _helper_{i}(t, n):\n    m = math.prod(t.shape[:1]) + {i}\n    y = torch.empty_like(t).view(-1)\n"
        f"    lib.relu(t.contiguous(), y, min(n, m))\n    return y.reshape(t.shape)\n"
        for i in range(30)
    )
    source = honest(prelude="import math\n" + helpers)
    assert len(source.splitlines()) >= 200
    precheck(source, RELU)  # the reference's op names are cached per problem; time the steady state

    start = time.perf_counter()
    result = precheck(source, RELU)
    elapsed = time.perf_counter() - start

    print(f"precheck of a {len(source.splitlines())}-line candidate: {elapsed * 1000:.1f} ms")
    assert result is None
    assert elapsed < 0.5


def test_kernelbench_build_settings_may_be_set_but_nothing_else_rides_along():
    arch = candidate("return x", "import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'")
    assert precheck(arch, RELU) is None
    smuggled = candidate("return x", "import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = open('/etc/hostname').read()")
    assert precheck(smuggled, RELU)["error_class"] == "file_access"
