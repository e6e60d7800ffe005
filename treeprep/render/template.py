"""The chat template: jinja in a sandbox with limits, rendering like ``apply_chat_template``.

What it replaces
----------------
Rendering used to go through transformers (``AutoTokenizer`` and ``apply_chat_template``), whose
import alone costs seconds and hundreds of megabytes per build. :class:`ChatTemplate` compiles the
template itself with jinja, in the environment transformers builds for it: the immutable sandbox,
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and a ``{% generation %}``
tag that renders its body, the ``tojson`` filter as ``json.dumps(x, ensure_ascii=False)``, and the
globals ``raise_exception``, ``strftime_now``, ``dict`` and a ``namespace`` that refuses names
starting with ``_``. The messages are passed as ``apply_chat_template`` passes them: keys whose
value is ``None`` dropped, reasoning aliased as ``thinking`` and ``reasoning_content``, and the
named special tokens (``bos_token``, ``eos_token``, ...) as variables. The tests compare it with
``apply_chat_template`` on every tokenizer in ``../shared/data`` and the built-in one; that, not
this description, is the contract.

A fixed date
------------
``strftime_now`` does not read the clock: :mod:`treeprep.render.dates`.

Limits (hostile templates)
--------------------------
A chat template comes with the tokenizer and is untrusted code. The sandbox stops it from reaching
Python internals, and these limits stop it from running forever or filling memory; each breach is
a :class:`~treeprep.errors.RenderError` for that record, never a crashed build:

- time: a watchdog thread interrupts a render that runs past ``timeout_s`` (an asynchronous
  exception raised in the rendering thread between two bytecodes, so a jinja loop stops wherever
  it is); the sandbox's calls also check the deadline;
- size: the output is counted chunk by chunk and stopped past ``max_chars``; ``*`` and ``**`` are
  checked before they run, strings passed to or returned by calls and strings stored in a
  namespace are checked too, so a string doubled in a loop stops at the limit instead of growing
  to gigabytes; a ``MemoryError`` that slips through is caught as well;
- depth: a ``RecursionError`` (a macro calling itself) is caught;
- a time budget per build (``budget_s``): the seconds spent in renders that ran past their time
  limit add up, and once the budget is spent every render fails at once with that reason. The
  probes a renderer runs when it is built stop at the first render that breaks a limit. A build's
  worker processes share one budget (:meth:`ChatTemplate.share_budget`: a shared-memory counter
  the pool inherits), so ``--workers N`` spends one budget, not N; a render already running
  when it runs out still finishes (at most one per worker past the budget).

A breach is a :class:`~treeprep.errors.TemplateLimitError` (a ``RenderError``), so callers that
probe a template can tell "the template refused this conversation" from "the template is
hostile".

Trade-offs: the watchdog cannot interrupt a single long C call (a regular expression, a huge
join), only what follows it, which the size checks keep short. Checks on ``+`` and ``~`` would slow
every template down; growth through them is bounded by the namespace and output checks instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from treeprep.errors import RenderError, TemplateLimitError
from treeprep.render.dates import DEFAULT_DATE, reads_date, reported_date, strftime_at

#: a render function: (messages, tools, add_generation_prompt) -> text
RenderFn = Callable[[list[dict], list[dict] | None, bool], str]

#: names a message's reasoning may be passed under (transformers' aliases)
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """What one render may cost."""

    #: wall-clock seconds per render
    timeout_s: float = 10.0
    #: characters of output (and of any one string the template builds)
    max_chars: int = 64 << 20
    #: the largest exponent ``**`` may use
    max_power: int = 4096
    #: wall-clock seconds a build may spend, in all, in renders that ran past ``timeout_s``;
    #: once spent, every render fails at once (a hostile template costs a build minutes, not
    #: ``timeout_s`` per record and per probe for hours)
    budget_s: float = 120.0


#: how often the watchdog looks at the running renders (a render may overrun its limit by this)
_POLL_S = 0.05


class _Timeout(BaseException):
    """Raised asynchronously in a thread whose render ran past its deadline (a BaseException, so
    that nothing inside jinja catches it)."""


class _TooBig(Exception):
    pass


# --------------------------------------------------------------------------------------------
# the watchdog: one daemon thread per process interrupts renders that run past their deadline
# --------------------------------------------------------------------------------------------


class _Watchdog:
    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[int, list[Any]] = {}  # thread id -> [deadline, fired]
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle = False

    def arm(self, seconds: float) -> int:
        tid = threading.get_ident()
        with self._lock:
            self._active[tid] = [time.monotonic() + seconds, False]
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="treeprep-render-watchdog", daemon=True
                )
                self._thread.start()
            idle = self._idle
        if idle:  # only a sleeping watchdog is woken: waking it per render would cost the GIL
            self._wake.set()
        return tid

    def disarm(self, tid: int) -> None:
        with self._lock:
            state = self._active.pop(tid, None)
            if state is not None and state[1]:
                # fired but maybe not delivered yet: withdraw it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)

    def _run(self) -> None:
        quiet = 0
        while True:
            with self._lock:
                now = time.monotonic()
                for tid, state in self._active.items():
                    # raised again at every poll until the render ends: an asynchronous
                    # exception delivered inside a callback (a gc hook) is swallowed there
                    if now >= state[0]:
                        state[1] = True
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(tid), ctypes.py_object(_Timeout)
                        )
                quiet = 0 if self._active else quiet + 1
                if quiet > 20:  # nothing rendered for a while: sleep until the next render
                    self._idle = True
                    self._wake.clear()
            if self._idle:
                self._wake.wait()
                self._idle = False
                quiet = 0
            else:
                time.sleep(_POLL_S)


_WATCHDOG: _Watchdog | None = None


def _watchdog() -> _Watchdog:
    global _WATCHDOG
    if _WATCHDOG is None:
        _WATCHDOG = _Watchdog()
    return _WATCHDOG


# --------------------------------------------------------------------------------------------
# the jinja environment
# --------------------------------------------------------------------------------------------


def _generation_tag() -> type:
    """``{% generation %}...{% endgeneration %}`` renders its body (the assistant-mask marks
    transformers tracks with it are not needed here)."""
    import jinja2
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> str:
            return str(caller())

    return GenerationTag


def _namespace_class(max_chars: int) -> type:
    """transformers' namespace (no names starting with ``_``) that also refuses huge values."""
    import jinja2

    class TemplateNamespace(jinja2.utils.Namespace):  # type: ignore[misc]
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name, value in attrs.items():
                TemplateNamespace._check(name, value)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: Any, value: Any) -> None:
            TemplateNamespace._check(name, value)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any, value: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}. Please rename the attribute."
                )
            if isinstance(value, str | list) and len(value) > max_chars:
                raise _TooBig(f"a namespace value of {len(value)} items")

    return TemplateNamespace


#: the fast paths' sets (see :func:`_fast_lookups`)
_DICT_ATTRS = frozenset(dir(dict))
_DICT_READS = frozenset(("items", "keys", "values", "get"))
_LOOP_ATTRS = frozenset(
    ("index", "index0", "first", "last", "length", "revindex", "revindex0", "depth", "depth0")
)
_STR_METHODS = frozenset(a for a in dir(str) if not a.startswith("_")) - {"format", "format_map"}
_BUILTIN_METHOD: Any = type("".strip)


def _fast_lookups(namespace_cls: type) -> type:
    """A sandbox mixin with fast paths for plain data: for a dict key that is not a dict
    attribute, a public str method (not ``format``), a read-only dict method, the loop variable's
    properties or a namespace value, the result is what the sandbox returns, without its checks;
    everything else goes through the sandbox."""
    from jinja2.runtime import LoopContext

    # bound here so that the hot paths read closure cells, not module globals
    dict_attrs, dict_reads = _DICT_ATTRS, _DICT_READS
    loop_attrs, str_attrs = _LOOP_ATTRS, _STR_METHODS

    class FastLookups:
        def getattr(self, obj: Any, attribute: str) -> Any:
            # For a plain dict whose key is not also a dict attribute the sandbox returns the item;
            # a public str method other than format/format_map is what the sandbox returns too.
            t = type(obj)
            if t is dict and attribute not in dict_attrs:
                try:
                    return obj[attribute]
                except (KeyError, TypeError):
                    pass
            elif (
                (t is str and attribute in str_attrs)
                or (t is LoopContext and attribute in loop_attrs)
                or (t is dict and attribute in dict_reads)
            ):
                return getattr(obj, attribute)
            elif t is namespace_cls and attribute[:1] != "_":
                try:
                    return getattr(obj, attribute)
                except AttributeError:
                    pass
            return super().getattr(obj, attribute)  # type: ignore[misc]

        def getitem(self, obj: Any, argument: Any) -> Any:
            if type(obj) is dict and type(argument) is str:
                try:
                    return obj[argument]
                except KeyError:
                    pass
            return super().getitem(obj, argument)  # type: ignore[misc]

    return FastLookups


def _limited_calls(limits: RenderLimits) -> type:
    """A sandbox mixin that checks ``*``, ``**`` and every call against the limits (time and
    size), calling a read-only str/dict method directly: there is nothing to check in it."""
    max_chars = limits.max_chars
    deadline = _deadline
    builtin_method = _BUILTIN_METHOD
    fast_methods = _STR_METHODS | _DICT_READS

    class LimitedCalls:
        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, str | list | tuple) and isinstance(n, int):
                        if len(seq) * n > max_chars:
                            raise _TooBig(f"'*' would build {len(seq) * n} items")
            elif operator == "**" and isinstance(right, int) and abs(right) > limits.max_power:
                raise _TooBig(f"'**' with exponent {right}")
            return super().call_binop(context, operator, left, right)  # type: ignore[misc]

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            if time.monotonic() > deadline[0]:
                raise _Timeout
            for a in args:
                if type(a) is str and len(a) > max_chars:
                    raise _TooBig(f"a string of {len(a)} characters")
            if (
                type(__obj) is builtin_method
                and type(__obj.__self__) in (str, dict)
                and __obj.__name__ in fast_methods
            ):
                # a read-only str/dict method: nothing to check (jinja's own bookkeeping
                # arguments are dropped, as Context.call drops them)
                kwargs.pop("_loop_vars", None)
                kwargs.pop("_block_vars", None)
                out = __obj(*args, **kwargs)
            else:
                out = super().call(__context, __obj, *args, **kwargs)  # type: ignore[misc]
            if type(out) in (str, list) and len(out) > max_chars:
                raise _TooBig(f"a call returned {len(out)} items")
            return out

    return LimitedCalls


def _sandbox_class(limits: RenderLimits, namespace_cls: type) -> type:
    """The immutable sandbox with the limits' checks (:func:`_limited_calls`) and fast paths for
    plain data (:func:`_fast_lookups`)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    fast = _fast_lookups(namespace_cls)
    limited = _limited_calls(limits)

    class Env(fast, limited, ImmutableSandboxedEnvironment):  # type: ignore[misc,valid-type]
        intercepted_binops = frozenset({"*", "**"})

    return Env


def _environment(limits: RenderLimits, *, bare: bool = False) -> Any:
    """transformers' chat template environment, with the limits (see the module docstring).
    ``bare``: jinja's own sandbox with the limits and ``loopcontrols``, nothing of transformers'
    (no ``raise_exception``, ``strftime_now``, ``tojson`` options or ``generation`` tag), as
    vLLM's probes of a template render it."""
    import jinja2
    from jinja2.ext import loopcontrols

    namespace_cls = _namespace_class(limits.max_chars)
    env_cls = _sandbox_class(limits, namespace_cls)
    if bare:
        return env_cls(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    env = env_cls(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_tag(), loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_at(DEFAULT_DATE)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = namespace_cls
    return env


#: the current render's deadline (monotonic seconds), read by the sandbox's call hook; one
#: render at a time per process is the norm, and a stale value only makes the check lenient
_deadline: list[float] = [float("inf")]


def plain_messages(messages: list[dict[str, Any]], wrap: bool = False) -> list[dict[str, Any]]:
    """Messages as ``apply_chat_template`` hands them to the template: keys whose value is None
    dropped, reasoning filled in under ``thinking`` and ``reasoning_content``; with ``wrap``, a
    string content given as one text part, as a server that hands the template parts does
    (:attr:`ChatTemplate.wrap_strings`)."""
    out = []
    for m in messages:
        if any(v is None for v in m.values()):
            m = {k: v for k, v in m.items() if v is not None}
        if wrap and isinstance(m.get("content"), str):
            m = {**m, "content": [{"type": "text", "text": m["content"]}]}
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


class ChatTemplate:
    """A chat template compiled in the limited sandbox (see the module docstring).

    >>> t = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")
    >>> t.render([{"role": "user", "content": "hi"}], None, False)
    'user:hi;'
    """

    def __init__(
        self,
        source: str,
        special_tokens: dict[str, str] | None = None,
        *,
        limits: RenderLimits | None = None,
        date: datetime | None = None,
        bare: bool = False,
    ) -> None:
        """``bare``: compiled in jinja's own sandbox (the limits kept), as vLLM's probes
        compile it, for :meth:`render_variables` alone."""
        self.source = source
        #: hand a string content to the template as one text part (the inference server's rule
        #: for a template that loops over parts: :mod:`treeprep.render.text_parts`)
        self.wrap_strings = False
        self.limits = limits or RenderLimits()
        #: the date ``strftime_now`` reports when a render gives none (None: :data:`DEFAULT_DATE`)
        self.date = date
        self.special_tokens = dict(special_tokens or {})
        env = _environment(self.limits, bare=bare)
        try:
            self._template = env.from_string(source)
        except Exception as e:  # a syntax error: nothing can be rendered with it
            raise RenderError(f"the chat template does not compile: {type(e).__name__}: {e}") from e
        self._dates: dict[datetime, Callable[[str], str]] = {}
        self._reads_date = reads_date(source)
        #: renders that ran past the time limit, and the seconds they took (the budget's count):
        #: this process's own, or the build's, shared by its workers (:meth:`share_budget`)
        self._spent: Any = [0.0, 0.0]
        self._shared: Any = None

    def reported_date(self, now: datetime | None) -> datetime | None:
        """A date this template prints as it prints ``now``, the same for every call of a day
        where it prints only the day (:mod:`treeprep.render.dates`).

        >>> t = ChatTemplate("{{ strftime_now('%d %b %Y') }}")
        >>> t.reported_date(datetime(2025, 3, 1, 10, 2, 30))
        datetime.datetime(2025, 3, 1, 0, 0)
        """
        return reported_date(self._reads_date, now)

    @property
    def overruns(self) -> int:
        """Renders that ran past the time limit (in this build's processes once shared)."""
        return int(self._spent[0])

    @property
    def overrun_s(self) -> float:
        """Seconds those renders took: what the time budget counts."""
        return float(self._spent[1])

    def share_budget(self, shared: Any) -> None:
        """Count the time budget in ``shared`` from now on: a ``multiprocessing`` array of two
        doubles (renders past the time limit, their seconds) that a build's worker processes
        share, so that they spend one budget together. What this template spent so far is added
        to it; a forked worker inherits the sharing with the template."""
        with shared.get_lock():
            raw = shared.get_obj()
            raw[0] += self._spent[0]
            raw[1] += self._spent[1]
        self._shared = shared
        self._spent = raw  # read without the lock: a double is read whole

    def _spend(self, seconds: float) -> None:
        if self._shared is None:
            self._spent[0] += 1
            self._spent[1] += seconds
            return
        with self._shared.get_lock():
            self._spent[0] += 1
            self._spent[1] += seconds

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        *,
        now: datetime | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """The template's text; any failure or breached limit is a :class:`RenderError`. ``now``
        is the date ``strftime_now`` reports (default: :attr:`date`); ``extra``, the call's
        template kwargs (:mod:`treeprep.render.template_kwargs`), cannot replace the others."""
        when = now or self.date or DEFAULT_DATE
        strftime_now = self._dates.get(when)
        if strftime_now is None:
            if len(self._dates) > 1024:
                self._dates.clear()
            strftime_now = self._dates[when] = strftime_at(when)
        variables = {
            **(extra or {}),
            **self.special_tokens,
            "messages": plain_messages(messages, self.wrap_strings),
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            "strftime_now": strftime_now,
        }
        return self.render_variables(variables)

    def render_variables(self, variables: dict[str, Any]) -> str:
        """The template rendered with these variables alone, within the limits; any failure or
        breached limit is a :class:`RenderError`."""
        limits = self.limits
        if self.overrun_s >= limits.budget_s:
            raise TemplateLimitError(self._budget_reason())
        watchdog = _watchdog()
        start = time.monotonic()
        _deadline[0] = start + limits.timeout_s
        try:
            tid = watchdog.arm(limits.timeout_s)
            try:
                text, why, breach = self._render_once(variables)
            finally:
                _disarm(watchdog, tid)
        except _Timeout:  # delivered after _render_once returned, before the watchdog stopped
            text, why, breach = None, self._timeout_reason(), "time"
        finally:
            _deadline[0] = float("inf")
        if why is not None:
            if breach == "time":
                self._spend(time.monotonic() - start)
            raise TemplateLimitError(why) if breach else RenderError(why)
        assert text is not None
        return text

    def _budget_reason(self) -> str:
        return (
            f"the chat template's time budget is spent: {self.overruns} renders ran past their "
            f"limit of {self.limits.timeout_s:g} s ({self.overrun_s:.0f} s in all, budget "
            f"{self.limits.budget_s:g} s per build)"
        )

    def _timeout_reason(self) -> str:
        return f"the chat template ran past its time limit ({self.limits.timeout_s:g} s per render)"

    def _render_once(self, variables: dict[str, Any]) -> tuple[str | None, str | None, str]:
        """(text, None, ""), or (None, why the render failed, which limit it broke: "time",
        "limit" for the others, "" when the template itself failed)."""
        template = self._template
        max_chars = self.limits.max_chars
        try:
            parts = []
            n = 0
            for chunk in template.root_render_func(template.new_context(variables)):
                n += len(chunk)
                if n > max_chars:
                    raise _TooBig(f"the output passed {max_chars} characters")
                parts.append(chunk)
            return "".join(parts), None, ""
        except _Timeout:
            return None, self._timeout_reason(), "time"
        except _TooBig as e:
            return None, f"the chat template's output is too large: {e}", "limit"
        except MemoryError:
            return None, "the chat template ran out of memory", "limit"
        except RecursionError:
            return None, "the chat template recursed too deeply (RecursionError)", "limit"
        except Exception as e:
            return None, f"the chat template failed: {type(e).__name__}: {e}", ""


def _disarm(watchdog: _Watchdog, tid: int) -> None:
    """Stop the watchdog for this thread, even if a last timeout is delivered meanwhile (once
    disarmed, none is pending and none can come)."""
    while True:
        try:
            watchdog.disarm(tid)
            return
        except _Timeout:
            continue


def first_char_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (the shorter length if none)."""
    m = min(len(a), len(b))
    return next((i for i in range(m) if a[i] != b[i]), m)


@lru_cache(maxsize=16)
def template_ast(source: str) -> Any:
    """The template's jinja syntax tree (``jinja2.nodes.Template``), parsed once per source, as
    the servers read a template's source to decide what to hand it
    (:mod:`treeprep.render.text_parts`, :mod:`treeprep.render.template_kwargs`); None for a
    template that does not parse (it fails at render, naming why)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        return ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateError:
        return None
