"""A static scan of a candidate before anything compiles or runs (INTEGRITY.md rows 1, 9, 10, 12 and 14).

`precheck(candidate_source, problem_source)` parses the candidate and refuses, with one line that
names the line number and the construct, what no honest kernel needs: process, network, file and
dynamic-import modules; patching torch, time, sys, gc, builtins or numpy (the harness's clocks and
comparisons); reading the harness's frames; the attributes that lead from any object to frames,
namespaces and other modules (`e.__traceback__.tb_frame.f_back`, `f.__globals__`, `__code__`,
`__closure__`, `gi_frame`, `__dict__`, `__subclasses__`, `__mro__`, `__builtins__`, ...), by name or as
the string given to getattr, and `vars()`, `globals()`, `locals()`; reading torch's dispatch-mode or
profiler state (whether it is being watched); and calling the compute ops the reference Model calls.
It is a cheap first filter, not the last word: names built from computed strings
(`getattr(e, "tb_" + "frame")`) and native code escape any static scan, so nothing here decides
that a candidate is honest: the worker's runtime checks and the orchestrator's judgement of every
output (INTEGRITY.md row 12) still run on whatever passes.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

FORBIDDEN_MODULES = set(
    "subprocess socket multiprocessing urllib urllib3 http requests httpx aiohttp ftplib smtplib xmlrpc webbrowser"
    " asyncio signal pty shutil tempfile pickle marshal dill cloudpickle shelve importlib runpy ctypes tasks".split()
)
IMPORT_REASONS = {"ctypes": "kernels are called through kforge.kernels", "tasks": "the harness is off limits"}
BUILD_SETTINGS = frozenset({"TORCH_CUDA_ARCH_LIST", "MAX_JOBS"})  # environment keys a candidate may set
HELPER_API = "kforge.kernels"  # the only part of kforge a candidate imports (load_cpp, load_cuda)
# Dotted names (fnmatch patterns) a candidate may not reach: error_class -> (why, names).
REFUSED_NAMES = {
    "process_or_network": (
        "a candidate may not start, signal or end processes",
        "os.system os.popen os.exec* os.spawn* os.posix_spawn* os.fork* os.kill* os._exit os.abort sys.exit"
        " builtins.exit builtins.quit",
    ),
    "environment": ("a candidate may not read or change the environment", "os.environ* os.getenv os.putenv"),
    "dynamic_code": (
        "code runs only from the candidate's source and kforge.kernels",
        "builtins.eval builtins.exec builtins.compile builtins.__import__ builtins.breakpoint"
        " torch.ops.load_library torch.classes.load_library",
    ),
    "file_access": (
        "a candidate may not read or write files",
        "builtins.open io.open io.FileIO os.open os.remove os.unlink os.listdir os.scandir os.walk os.rmdir"
        " os.rename os.mkdir os.makedirs os.chdir glob.* torch.load torch.save torch.from_file numpy.load numpy.save*"
        " numpy.fromfile numpy.loadtxt",
    ),
    "harness_tampering": (
        "a candidate may not reach into the harness",
        "sys.modules* sys._getframe sys.settrace sys.setprofile gc.get_objects gc.get_referr* builtins.__builtins__"
        " builtins.object.__setattr__ builtins.type.__setattr__ torch.use_deterministic_algorithms"
        " torch.utils.deterministic* builtins.vars builtins.globals builtins.locals builtins.__loader__"
        " builtins.__spec__ sys._current_frames sys._getframemodulename sys.monitoring* inspect.*"
        " traceback.walk_stack traceback.extract_stack traceback.format_stack traceback.print_stack"
        " traceback.StackSummary*",
    ),
    # INTEGRITY.md row 14: a candidate that can tell when it is watched computes only then
    "watched_state": (
        "torch's dispatch-mode and profiler state tell a candidate when it is watched",
        "torch._C._*dispatch* torch._C._*Dispatch* torch._C._*torch_function* torch._C._*TorchFunction*"
        " torch._C._*_mode* torch.utils._python_dispatch* torch.overrides._* torch.overrides.*Mode*"
        " torch._C._autograd* torch._C._profiler* torch.autograd.profiler._* torch.autograd._profiler*"
        " torch.profiler._*",
    ),
}
# Rules reported under another rule's error_class.
ERROR_CLASSES = {"watched_state": "harness_tampering"}
# Attributes that lead from any value to frames, function internals, namespaces or the class graph,
# where the scan cannot follow: refused wherever they appear (x.attr, or "attr" as a string constant,
# as getattr, hasattr and operator.attrgetter take it). why -> names.
_REFUSED_ATTRS = {
    "frames and tracebacks lead to the harness's variables": "f_back f_locals f_globals f_code f_builtins f_trace"
    " tb_frame tb_next gi_frame cr_frame ag_frame gi_code cr_code ag_code gi_yieldfrom cr_await ag_await"
    " __traceback__",
    "a function's globals, code and closure lead to modules and values the scan cannot see": "__globals__"
    " __code__ __closure__ cell_contents __wrapped__ __self__ __builtins__ co_consts co_names co_code"
    " co_varnames co_freevars co_cellvars",
    "namespaces and the class graph reach any attribute by a computed name": "__dict__ __subclasses__ __mro__"
    " mro __bases__ __base__ __loader__ __spec__",
}
REFUSED_ATTRS = {attr: why for why, names in _REFUSED_ATTRS.items() for attr in names.split()}
# "{0.__traceback__.tb_frame.f_back.f_locals}".format(e): str.format reads attributes from its fields.
_FORMAT_FIELD = re.compile(r"\{\w*(?:\.\w+|\[[^\]{}]*\])*?\.(" + "|".join(REFUSED_ATTRS) + r")(?!\w)")
_RULES = {
    kind: re.compile("|".join(map(fnmatch.translate, names.split()))) for kind, (_, names) in REFUSED_NAMES.items()
}
_REFUSED = [name for _, names in REFUSED_NAMES.values() for name in names.split()]
_RULE_ROOTS = {name.split(".")[0] for name in _REFUSED}
# Builtins that count as the builtin even where a function parameter of the same name exists.
SENSITIVE_BUILTINS = {name[9:] for name in _REFUSED if name.startswith("builtins.")}
SENSITIVE_BUILTINS |= {"setattr", "delattr", "getattr"}
PROTECTED_ROOTS = {"torch", "time", "builtins", "sys", "gc", "numpy", "os", "kforge"}
PATH_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "iterdir", "glob", "rglob", "unlink"}
KERNEL_LOADERS = ("kforge.kernels.", "torch.utils.cpp_extension.")  # what they return is the candidate's own code
# Allocation, views, copies and shape queries: never "the reference op", whoever calls them.
ALWAYS_ALLOWED = set(
    "empty empty_like empty_strided zeros zeros_like ones ones_like full full_like arange tensor as_tensor"
    " manual_seed contiguous view view_as reshape flatten permute transpose t size shape numel stride dim to"
    " float half double bfloat16 cuda cpu data_ptr unsqueeze squeeze expand expand_as clone detach copy item"
    " is_contiguous element_size storage_offset".split()
)
# A matrix product through any of these is the same library GEMM.
GEMM_OPS = ["matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "einsum", "tensordot", "dot", "mv", "inner"]
NOT_LAYERS = {"Sequential", "ModuleList", "ModuleDict", "Parameter", "ParameterList", "ParameterDict", "Module"}
LAYER_CALLS = {"forward", "__call__", "_call_impl"}
NOT_SCANNED = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


@dataclass
class _Module:
    """What one parsed file binds: import aliases, names, nn layers and compiled kernel libraries."""

    aliases: dict[str, str] = field(default_factory=dict)  # local name -> dotted path ("F" -> "torch.nn.functional")
    module_names: set[str] = field(default_factory=set)  # bound at module level
    local_names: set[str] = field(default_factory=set)  # bound anywhere (locals, parameters)
    layer_attrs: dict[str, set[str]] = field(default_factory=dict)  # self.<attr> -> nn layer classes built into it
    libs: set[str] = field(default_factory=set)  # names holding a load_cpp/load_cuda/load_inline result
    lib_attrs: set[str] = field(default_factory=set)  # self.<attr> holding one

    def resolve(self, node: ast.AST) -> str | None:
        """Dotted path of a name, attribute chain or getattr(x, "const") rooted at an import or a
        builtin ("torch.nn.functional.relu"); None for anything rooted at a value (self, x, a call)."""
        parts: list[str] = []
        while True:
            if isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            elif isinstance(node, ast.Subscript):
                node = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
                if self.resolve(node.func) != "builtins.getattr":
                    return None
                if not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                    return None
                parts.append(node.args[1].value)
                node = node.args[0]
            else:
                break
        if not isinstance(node, ast.Name):
            return None
        if node.id in self.aliases:
            root = self.aliases[node.id]
        elif node.id in self.module_names or (node.id in self.local_names and node.id not in SENSITIVE_BUILTINS):
            return None
        elif node.id in SENSITIVE_BUILTINS or hasattr(builtins, node.id):
            root = "builtins." + node.id
        else:
            return None
        return ".".join([root, *reversed(parts)])

    def is_lib(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in self.libs) or _self_attr(node) in self.lib_attrs


def _self_attr(node: ast.AST) -> str | None:
    """X for `self.X`, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _analyze(tree: ast.Module) -> _Module:
    scope, nodes = _Module(), list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import a.b` binds a; `import a.b as x` binds x to a.b
                top = alias.name.split(".")[0]
                scope.aliases[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and not node.level:
            scope.aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            scope.local_names.add(node.id)
        elif isinstance(node, (ast.arg, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.local_names.add(node.arg if isinstance(node, ast.arg) else node.name)
    stack: list[ast.AST] = list(tree.body)
    while stack:  # module level only: not into defs, classes, lambdas or comprehensions
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.module_names.add(node.name)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            scope.module_names.add(node.id)
        elif not isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            stack.extend(ast.iter_child_nodes(node))
    assigns = [node for node in nodes if isinstance(node, ast.Assign)]
    for _ in range(2):  # twice, so an alias of an alias resolves
        for node in assigns:
            value_path = scope.resolve(node.value)
            loader = scope.resolve(node.value.func) if isinstance(node.value, ast.Call) else None
            is_lib = (loader or "").startswith(KERNEL_LOADERS) or scope.is_lib(node.value)
            for target in node.targets:
                if isinstance(target, ast.Name) and value_path and target.id not in scope.aliases:
                    scope.aliases[target.id] = value_path  # T = torch.Tensor
                    scope.module_names.discard(target.id)
                if is_lib and isinstance(target, ast.Name):
                    scope.libs.add(target.id)
                if _self_attr(target) and is_lib:
                    scope.lib_attrs.add(_self_attr(target))
                elif _self_attr(target):
                    layers = {_layer_class(call, scope) for call in ast.walk(node.value) if isinstance(call, ast.Call)}
                    scope.layer_attrs.setdefault(_self_attr(target), set()).update(layers - {None})
    return scope


def _layer_class(call: ast.Call, scope: _Module) -> str | None:
    """Linear for a call of nn.Linear (however imported), else None."""
    path = scope.resolve(call.func) or ""
    name = path.rsplit(".", 1)[-1]
    return name if path.startswith("torch.nn.") and name[:1].isupper() and name not in NOT_LAYERS else None


def _layer_ops(layer: str) -> list[str]:
    """Functional names of an nn layer, the telling one first: Linear -> linear (+ GEMMs), LayerNorm ->
    layer_norm, BatchNorm2d -> batch_norm2d, batch_norm."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", layer.replace("ReLU", "Relu").replace("GELU", "Gelu")).lower()
    return _with_gemm([snake, layer.lower(), re.sub(r"\d+d$", "", snake)])


def _with_gemm(ops: list[str]) -> list[str]:
    return ops + GEMM_OPS if set(ops) & set(GEMM_OPS) else ops


def _op_name(name: str) -> str:
    """relu_ -> relu: the in-place form is the same op."""
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def _called_ops(call: ast.Call, scope: _Module) -> tuple[list[str], str]:
    """The compute ops a call runs (op names, the telling one first) and how to name the call."""
    func = call.func
    path = scope.resolve(func)
    if path:  # torch.relu, F.gelu, np.matmul; math.prod and triton.cdiv compute no torch op
        name = path.rsplit(".", 1)[-1]
        is_op = path.split(".")[0] in ("torch", "numpy") and not name[:1].isupper()
        return ([_op_name(name)] if is_op else []), path
    if isinstance(func, ast.Call) and _layer_class(func, scope):  # nn.ReLU()(x)
        return _layer_ops(_layer_class(func, scope)), f"a new nn.{_layer_class(func, scope)}"
    while isinstance(func, ast.Subscript):  # self.layers[0](x)
        func = func.value
    if not isinstance(func, ast.Attribute) or scope.is_lib(func.value):  # lib.relu(x, y, n): the kernel
        return [], ""
    attr = _self_attr(func) or (_self_attr(func.value) if func.attr in LAYER_CALLS else None)
    if attr is not None:  # self.fc1(x), self.fc1.forward(x); a method of ModelNew's own runs no torch op
        layers = sorted(scope.layer_attrs.get(attr, ()))
        return [op for layer in layers for op in _layer_ops(layer)], f"self.{attr} (an nn.{'/'.join(layers)})"
    if scope.resolve(func.value):
        return [], ""
    return [_op_name(func.attr)], f"the tensor method .{func.attr}()"


@lru_cache(maxsize=64)
def reference_ops(problem_source: str) -> frozenset[str]:
    """Op names the problem's Model computes outside __init__: torch.X / F.X calls, tensor methods,
    `@` as "matmul" and the functional names of the nn layers it calls, less allocation and shape
    ops; the whole GEMM family when any GEMM is among them. No Model gives the empty set; a problem
    that does not parse raises SyntaxError (problems are ours, not the candidate's)."""
    tree = ast.parse(problem_source)
    scope = _analyze(tree)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    ops: list[str] = []
    for method in model.body if model else []:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name != "__init__":
            for node in ast.walk(method):
                if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
                    ops.append("matmul")
                elif isinstance(node, ast.Call):
                    ops += _called_ops(node, scope)[0]
    return frozenset(_with_gemm([op for op in ops if op not in ALWAYS_ALLOWED]))


def _rule_for(path: str) -> str | None:
    """The error_class of a refused dotted name, else None."""
    if path.split(".")[0] not in _RULE_ROOTS:
        return None
    return next((kind for kind, pattern in _RULES.items() if pattern.match(path)), None)


def _import_violations(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    if isinstance(node, ast.ImportFrom) and node.level:
        return []  # relative: nothing to import from, the candidate is not in a package
    found = []
    modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    if isinstance(node, ast.ImportFrom):  # from os import system; from kforge import config
        modules = [f"{node.module}.{a.name}" for a in node.names] if node.module == "kforge" else modules
        found += [
            (_rule_for(p), f"imports {p}: {REFUSED_NAMES[_rule_for(p)][0]}")
            for p in (f"{node.module}.{a.name}" for a in node.names)
            if _rule_for(p)
        ]
    if isinstance(node, ast.Import):  # import torch.utils._python_dispatch as pd
        found += [(_rule_for(m), f"imports {m}: {REFUSED_NAMES[_rule_for(m)][0]}") for m in modules if _rule_for(m)]
    for module in modules:
        top = module.split(".")[0]
        if top == "kforge" and not (module == HELPER_API or module.startswith(HELPER_API + ".")):
            found.append(("forbidden_import", f"imports {module}: only {HELPER_API} is open to candidates"))
        elif top in FORBIDDEN_MODULES:
            found.append(("forbidden_import", f"imports {module}: {IMPORT_REASONS.get(top, 'no kernel needs it')}"))
    return found


def _node_violations(node: ast.AST, scope: _Module) -> list[tuple[str, str]]:
    """(rule, reason) for the import, name, tampering and file rules at one node; a rule is its
    error_class unless ERROR_CLASSES names another."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return _import_violations(node)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value in REFUSED_ATTRS:
            return [("harness_tampering", f"names {node.value!r} in a string: {REFUSED_ATTRS[node.value]}")]
        field = _FORMAT_FIELD.search(node.value)
        if field:
            why = REFUSED_ATTRS[field.group(1)]
            return [("harness_tampering", f"names .{field.group(1)} in a format field ({field.group(0)}...): {why}")]
        return []
    if not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        return []
    found, path = [], scope.resolve(node)
    if isinstance(node, ast.Attribute) and node.attr in REFUSED_ATTRS:
        found.append(("harness_tampering", f"uses .{node.attr}: {REFUSED_ATTRS[node.attr]}"))
    if path and isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)):
        # rebinding a name of its own is the candidate's business; changing a module's attribute is not
        root, kind = path.split(".")[0], _rule_for(path)
        if kind and not isinstance(node, ast.Name):
            found.append((kind, f"assigns to {path}: {REFUSED_NAMES[kind][0]}"))
        elif root in PROTECTED_ROOTS and not isinstance(node, ast.Name):
            found.append(("harness_tampering", f"assigns to {path}: a candidate may not patch {root}"))
    elif path and _rule_for(path):
        found.append((_rule_for(path), f"uses {path}: {REFUSED_NAMES[_rule_for(path)][0]}"))
    if isinstance(node, ast.Call):
        func_path = scope.resolve(node.func)
        target = (scope.resolve(node.args[0]) if node.args else None) or ""
        if func_path in ("builtins.setattr", "builtins.delattr") and target.split(".")[0] in PROTECTED_ROOTS:
            found.append(("harness_tampering", f"{func_path[9:]}() on {target}: a candidate may not patch it"))
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        if receiver and node.func.attr in PATH_METHODS and not scope.resolve(receiver) and not scope.is_lib(receiver):
            found.append(("file_access", f"calls .{node.func.attr}(), which reads or writes files"))
    return found


def _reference_op_action(node: ast.AST, scope: _Module, refused: frozenset[str]) -> tuple[str, str] | None:
    """(how the node reaches it, the op) when a node computes one of the `refused` ops, else None."""
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult) and "matmul" in refused:
        return "uses the @ operator", "matmul"
    if isinstance(node, ast.Call):
        ops, label = _called_ops(node, scope)
        return next(((f"calls {label}", op) for op in ops if op in refused), None)
    path = scope.resolve(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
    if path and path.split(".")[0] in ("torch", "numpy") and _op_name(path.rsplit(".", 1)[-1]) in refused:
        return f"refers to {path}", _op_name(path.rsplit(".", 1)[-1])
    return None


def _is_jit(node: ast.AST, scope: _Module) -> bool:
    """A function decorated with triton.jit, triton.autotune(...) or the like: Triton, not torch."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return any((scope.resolve(getattr(d, "func", d)) or "").startswith("triton") for d in node.decorator_list)


def _sets_a_build_setting(node: ast.AST, scope: _Module) -> bool:
    """`os.environ["TORCH_CUDA_ARCH_LIST"] = ...`: KernelBench candidates set it before load_inline."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript)):
        return False
    target = node.targets[0]
    key = target.slice.value if isinstance(target.slice, ast.Constant) else None
    return scope.resolve(target.value) == "os.environ" and key in BUILD_SETTINGS


def _violations(tree: ast.Module, refused: frozenset[str]) -> list[tuple[int, int, str, str]]:
    """(line, column, error_class, reason) for every refused construct. An explicit stack, not
    recursion: a deeply nested source cannot overflow the scan."""
    scope, found = _analyze(tree), []
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, False, False)]
    while stack:
        node, in_except, in_jit = stack.pop()
        if _sets_a_build_setting(node, scope):
            stack.append((node.value, in_except, in_jit))  # the value is still scanned, the target is allowed
            continue
        line, col = getattr(node, "lineno", 0), getattr(node, "col_offset", 0)
        for kind, reason in _node_violations(node, scope):
            attr = getattr(node, "attr", None)
            if attr in REFUSED_ATTRS and reason.startswith(f"uses .{attr}:") and node.end_lineno == line:
                found.append((line, node.end_col_offset - len(attr), kind, reason))  # e.a.b: .a first
            else:
                found.append((line, col, kind, reason))
        reached = None if in_jit else _reference_op_action(node, scope, refused)
        if reached:
            where = " in an except handler (a fallback)" if in_except else ""
            reason = f"{reached[0]}{where}: {reached[1]} is an op the reference computes, and library calls are off"
            found.append((line, col, "reference_op", reason))
        in_jit, in_except = in_jit or _is_jit(node, scope), in_except or isinstance(node, ast.ExceptHandler)
        stack.extend((c, in_except, in_jit) for c in ast.iter_child_nodes(node) if not isinstance(c, NOT_SCANNED))
    return found


def precheck(candidate_source: str, problem_source: str, allow_library_calls: bool = False) -> dict[str, Any] | None:
    """Scan a candidate's source against its problem's source before any compile.

    Returns None when nothing is refused, else a result shaped like the worker's, {"outcome",
    "error_class", "error_excerpt"}, whose excerpt is one line naming the line and the construct:
    compile_error for a source that does not parse or has no top-level class ModelNew,
    integrity_violation for the rest. Calls of the reference's compute ops are refused unless
    `allow_library_calls`.
    """
    try:
        tree = ast.parse(candidate_source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None)
        if line is None and "\0" in candidate_source:
            line = candidate_source[: candidate_source.index("\0")].count("\n") + 1
        message = f"{type(exc).__name__}: {getattr(exc, 'msg', None) or str(exc) or 'too deeply nested to parse'}"
        return _result("compile_error", type(exc).__name__, f"line {line}: {message}" if line else message)
    if not any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body):
        return _result("compile_error", "no_ModelNew", "the candidate defines no top-level class ModelNew")
    try:
        found = _violations(tree, frozenset() if allow_library_calls else reference_ops(problem_source))
    except RecursionError:  # the scan is iterative; this is a safety net for absurdly long call chains
        return _result("compile_error", "RecursionError", "RecursionError: too deeply nested to check")
    if found:
        line, _, kind, reason = min(found, key=lambda v: (v[0], v[1]))  # the first in source order
        return _result("integrity_violation", ERROR_CLASSES.get(kind, kind), f"line {line}: {reason}")
    return None


def _result(outcome: str, error_class: str, excerpt: str) -> dict[str, Any]:
    return {"outcome": outcome, "error_class": error_class, "error_excerpt": excerpt}
