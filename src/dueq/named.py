"""Named tasks: functions registered on a queue under a name (``@q.task``), scheduled by name
with their arguments as the payload, and run by a worker that dispatches on the name.

``TaskFunction`` is what ``Queue.task`` returns (``AsyncTaskFunction`` for ``AsyncQueue.task``):
calling it calls the function; ``schedule(**arguments, delay=...)`` schedules it. The name
travels in the task's envelope (``dueq._wire.envelope``); the arguments are checked against the
function's signature by the scheduling flow, before anything is written. ``dispatcher`` makes
the handler a ``Worker`` without a handler of its own runs: the name picks the function.

A function registered with ``context=True`` receives a ``TaskContext`` (its delivery's id,
attempt, max_attempts, queue, due time, lease; ``extend`` and ``cancelled``) as its first
argument; its other parameters are the task's arguments (what ``check_arguments`` binds). One
registered with ``durable=True`` receives a ``StepContext`` there (``AsyncStepContext`` for an
``async def`` one: ``dueq.durable``): a run that sleeps or waits ends with the delivery
released, and the dispatcher returns nothing for it.

Failures no retry can fix end the task dead at once (they are ``Unrecoverable``): a name no
function is registered for (``UnknownTask``: deploying the function and replaying the dead task
is the fix), arguments that do not bind (``InvalidArguments``, for a task scheduled by name
where the function was not at hand to check them) and a return value that is not JSON. The
binding is judged only when the call raised ``TypeError`` (a ``TypeError`` from inside the
function is an ordinary failure, retried), so a task that binds pays nothing for it.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, Literal, ParamSpec, TypeVar

from dueq._util.clock import Duration
from dueq._wire.envelope import result_entry, validate_task_name
from dueq.durable import Suspended, TaskContext, step_context
from dueq.exceptions import (
    ConfigurationError,
    InvalidArguments,
    InvalidTaskError,
    UnknownTask,
    Unrecoverable,
)
from dueq.model import BatchSpec, Task

P = ParamSpec("P")
R = TypeVar("R")

#: The keywords ``TaskFunction.schedule`` takes as options, not as the function's arguments.
#: A function with a parameter of one of these names is scheduled with ``schedule_args``.
#: They are ``Queue.schedule``'s options (a test pins the two sets equal).
OPTION_NAMES = frozenset(
    {
        "delay",
        "at",
        "id",
        "replace",
        "priority",
        "key",
        "timeout",
        "max_attempts",
        "expires",
        "debounce",
        "max_wait",
        "batch",
        "after",
        "after_policy",
        "fair_key",
    }
)


def _arguments_signature(
    name: str, signature: inspect.Signature, context: bool
) -> inspect.Signature:
    """``signature`` without its first parameter when that one receives the context."""
    if not context:
        return signature
    parameters = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not parameters or parameters[0].kind not in positional:
        raise ConfigurationError(
            f"task {name!r}: with context=True the function's first parameter receives the "
            "dueq.TaskContext: give it one that takes a positional argument (def f(ctx, ...))"
        )
    return signature.replace(parameters=parameters[1:])


_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def parameter_spec(signature: inspect.Signature) -> tuple[str, ...]:
    """The parameters a task's arguments may name, as short strings (``"x"`` required,
    ``"y="`` with a default, ``"**"`` for ``**kwargs``): what a worker's heartbeat lists so
    that ``dueq schedule --task`` can check arguments without the function (``spec_signature``).
    Positional-only and ``*args`` parameters take no argument by name and are left out."""
    spec = []
    for p in signature.parameters.values():
        if p.kind in _KEYWORD:
            spec.append(p.name if p.default is p.empty else p.name + "=")
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            spec.append("**")
    return tuple(spec)


def spec_signature(spec: Sequence[str]) -> inspect.Signature:
    """A signature that binds what the function ``parameter_spec`` described binds
    (ValueError for a spec that describes no signature)."""
    parameters = []
    for item in spec:
        if item == "**":
            parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
        elif item.endswith("="):
            parameters.append(
                inspect.Parameter(item[:-1], inspect.Parameter.KEYWORD_ONLY, default=None)
            )
        else:
            parameters.append(inspect.Parameter(item, inspect.Parameter.KEYWORD_ONLY))
    return inspect.Signature(parameters)


def bind_problem(signature: inspect.Signature, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not bind to ``signature`` as keywords, or None when they do: each
    unexpected keyword with the nearest parameter (``did you mean 'to'?``), then what
    ``Signature.bind`` said if it was about more."""
    try:
        signature.bind(**arguments)
    except TypeError as exc:
        said = str(exc)
    else:
        return None
    parameters = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return said
    names = [p.name for p in parameters if p.kind in _KEYWORD]
    reasons = []
    for given in (k for k in arguments if k not in names):
        near = difflib.get_close_matches(given, [n for n in names if n not in arguments], 1)
        hint = f" (did you mean {near[0]!r}?)" if near else f" (it takes {names})"
        reasons.append(f"unexpected keyword argument {given!r}{hint}")
    if not reasons or "unexpected keyword" not in said:
        reasons.append(said)
    return "; ".join(reasons)


#: What a bulk handler's tasks may be scheduled with: any arguments (the function takes the
#: list of items; each item's payload is its task's arguments).
_BULK_SIGNATURE = inspect.Signature([inspect.Parameter("arguments", inspect.Parameter.VAR_KEYWORD)])


def default_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function (the name ``@q.task`` gives it by default)."""
    module = getattr(fn, "__module__", None) or "__main__"
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not qualname:
        raise ConfigurationError(f"{fn!r} has no __qualname__: pass @q.task(name=...)")
    return f"{module}.{qualname}"


class TaskFunction(Generic[P, R]):
    """A function registered on a queue under ``name`` (``@q.task``).

    ``fn(...)`` calls the function. ``fn.schedule(**arguments, delay=..., ...)`` schedules it
    on ``fn.queue`` and returns the task id: the keyword arguments that are not options are
    the payload (a JSON object of the function's arguments), checked against its signature
    before anything is written (``InvalidTaskError``). The options are ``Queue.schedule``'s:
    ``delay``, ``at``, ``id``, ``replace``, ``priority``, ``key``, ``timeout``,
    ``max_attempts``, ``expires``, ``debounce``, ``max_wait``, ``batch``, ``after``,
    ``after_policy``, checked where ``Queue.schedule`` checks them (``Task`` and the
    scheduling flow); those given to ``@q.task`` are the defaults. A function with a parameter
    named like an option must be scheduled with ``schedule_args({...}, **options)``.

    With ``context=True`` the function's first parameter receives a ``TaskContext`` when a
    worker runs it; the task's arguments are the other parameters. With ``durable=True`` it
    receives a ``StepContext`` (``AsyncStepContext`` for ``async def``): docs/durable.md.
    """

    def __init__(
        self,
        queue: Any,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: Duration | None = None,
        priority: int | None = None,
        key: str | None = None,
        context: bool = False,
        durable: bool = False,
        batch: BatchSpec | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"a task must be a function, got {fn!r}")
        self.fn = fn
        self.queue = queue
        self.name = validate_task_name(default_name(fn) if name is None else name)
        if batch is not None and not isinstance(batch, BatchSpec):
            raise ConfigurationError(
                f"task {self.name!r}: batch= takes a dueq.BatchSpec, got {batch!r} (a task's "
                "batch id is given when it is scheduled: fn.schedule(..., batch='id'))"
            )
        if batch is not None and (durable or context):
            raise ConfigurationError(
                f"task {self.name!r}: a bulk handler (batch=) takes a list of dueq.Item, each "
                "with its task's id and attempt: it cannot be durable= or context= as well"
            )
        #: a bulk handler's BatchSpec (``@q.task(batch=...)``): the function is called with a
        #: list of ``dueq.Item`` (docs/bulk-handlers.md); None: one task per call
        self.batch = batch
        #: its steps are committed as they finish (``@q.task(durable=True)``): the function's
        #: first parameter receives a ``StepContext`` (``AsyncStepContext`` when async def)
        self.durable = bool(durable)
        #: the function's first parameter receives a ``TaskContext`` (``@q.task(context=True)``)
        self.context = bool(context) or self.durable
        #: the signature the task's arguments bind to (without the context parameter)
        self.signature = (
            _BULK_SIGNATURE
            if batch is not None
            else _arguments_signature(self.name, inspect.signature(fn), self.context)
        )
        positional = [
            p.name
            for p in self.signature.parameters.values()
            if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty
        ]
        if positional:
            raise ConfigurationError(
                f"task {self.name!r}: positional-only parameters {positional} cannot be given "
                "by name, and a task's arguments travel as a JSON object"
            )
        #: the parameters its arguments may name (``parameter_spec``: a worker's beat lists them)
        self.parameters = parameter_spec(self.signature)
        #: parameters named like a ``schedule`` option (see ``schedule_args``)
        self.shadowed = sorted(OPTION_NAMES.intersection(self.signature.parameters))
        # the defaults, validated now (a bad one is an error at decoration, not at schedule)
        self._defaults = Task(
            None, priority=priority or 0, key=key, timeout=timeout, max_attempts=max_attempts
        )
        self._defaults.options()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.queue.name!r}>"

    def check_arguments(self, arguments: Any) -> None:
        """InvalidArguments (an InvalidTaskError) unless ``arguments`` (a task's payload) is a
        dict that binds to the function's signature (nothing missing, nothing unexpected; an
        unexpected keyword is named with the nearest parameter)."""
        if not isinstance(arguments, dict):
            raise InvalidArguments(
                f"task {self.name!r}: the payload of a named task is a dict of its arguments, "
                f"got {type(arguments).__name__}"
            )
        if not all(isinstance(k, str) for k in arguments):
            raise InvalidArguments(f"task {self.name!r}: argument names must be str")
        problem = bind_problem(self.signature, arguments)
        if problem is not None:
            raise InvalidArguments(f"task {self.name!r}: {problem}")

    def task(
        self,
        arguments: Mapping[str, Any],
        *,
        delay: Duration | None = None,
        at: datetime | None = None,
        id: str | None = None,  # the public API names it id
        priority: int | None = None,
        key: str | None = None,
        timeout: Duration | None = None,
        max_attempts: int | None = None,
        expires: Duration | datetime | None = None,
        debounce: Duration | None = None,
        max_wait: Duration | None = None,
        batch: str | None = None,
        after: Sequence[str] | None = None,
        after_policy: Literal["fail", "run"] = "fail",
        fair_key: str | None = None,
    ) -> Task:
        """A ``dueq.Task`` of this function with these arguments, for ``schedule_many``: the
        one place its options meet the decorator's defaults (``schedule`` and
        ``schedule_args`` build their task here; ``Task`` and the scheduling flow check it)."""
        d = self._defaults
        return Task(
            dict(arguments),
            id,
            at,
            delay,
            d.priority if priority is None else priority,
            d.key if key is None else key,
            d.timeout if timeout is None else timeout,
            d.max_attempts if max_attempts is None else max_attempts,
            self.name,
            expires,
            debounce,
            max_wait,
            batch,
            () if after is None else after,
            after_policy,
            fair_key,
        )

    def _arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.shadowed:
            raise InvalidTaskError(
                f"task {self.name!r} has parameter(s) {self.shadowed} named like schedule "
                "options: schedule it with schedule_args({...}, delay=..., ...)"
            )
        return kwargs

    def schedule(
        self,
        *,
        delay: Duration | None = None,
        at: datetime | None = None,
        id: str | None = None,  # the public API names it id
        replace: bool = False,
        priority: int | None = None,
        key: str | None = None,
        timeout: Duration | None = None,
        max_attempts: int | None = None,
        expires: Duration | datetime | None = None,
        debounce: Duration | None = None,
        max_wait: Duration | None = None,
        batch: str | None = None,
        after: Sequence[str] | None = None,
        after_policy: Literal["fail", "run"] = "fail",
        fair_key: str | None = None,
        **arguments: Any,
    ) -> str:
        """Schedule a call of this function with ``arguments``; returns the task id."""
        task = self.task(
            self._arguments(arguments),
            delay=delay,
            at=at,
            id=id,
            priority=priority,
            key=key,
            timeout=timeout,
            max_attempts=max_attempts,
            expires=expires,
            debounce=debounce,
            max_wait=max_wait,
            batch=batch,
            after=after,
            after_policy=after_policy,
            fair_key=fair_key,
        )
        result = self.queue.schedule_many([task], replace=replace)
        return str(result.ids[0])

    def schedule_args(
        self,
        arguments: Mapping[str, Any],
        /,
        *,
        delay: Duration | None = None,
        at: datetime | None = None,
        id: str | None = None,  # the public API names it id
        replace: bool = False,
        priority: int | None = None,
        key: str | None = None,
        timeout: Duration | None = None,
        max_attempts: int | None = None,
        expires: Duration | datetime | None = None,
        debounce: Duration | None = None,
        max_wait: Duration | None = None,
        batch: str | None = None,
        after: Sequence[str] | None = None,
        after_policy: Literal["fail", "run"] = "fail",
        fair_key: str | None = None,
    ) -> str:
        """``schedule`` with the arguments as one mapping: for functions with a parameter
        named like an option (``key``, ``id``, ``timeout``, ...)."""
        task = self.task(
            arguments,
            delay=delay,
            at=at,
            id=id,
            priority=priority,
            key=key,
            timeout=timeout,
            max_attempts=max_attempts,
            expires=expires,
            debounce=debounce,
            max_wait=max_wait,
            batch=batch,
            after=after,
            after_policy=after_policy,
            fair_key=fair_key,
        )
        result = self.queue.schedule_many([task], replace=replace)
        return str(result.ids[0])


class AsyncTaskFunction(TaskFunction[P, R]):
    """``TaskFunction`` of an ``AsyncQueue`` (``AsyncQueue.task``): ``await fn.schedule(...)``
    and ``await fn.schedule_args(...)``; the function itself may be ``async def`` or plain."""

    async def schedule(  # type: ignore[override]
        self,
        *,
        delay: Duration | None = None,
        at: datetime | None = None,
        id: str | None = None,  # the public API names it id
        replace: bool = False,
        priority: int | None = None,
        key: str | None = None,
        timeout: Duration | None = None,
        max_attempts: int | None = None,
        expires: Duration | datetime | None = None,
        debounce: Duration | None = None,
        max_wait: Duration | None = None,
        batch: str | None = None,
        after: Sequence[str] | None = None,
        after_policy: Literal["fail", "run"] = "fail",
        fair_key: str | None = None,
        **arguments: Any,
    ) -> str:
        """Schedule a call of this function with ``arguments``; returns the task id."""
        task = self.task(
            self._arguments(arguments),
            delay=delay,
            at=at,
            id=id,
            priority=priority,
            key=key,
            timeout=timeout,
            max_attempts=max_attempts,
            expires=expires,
            debounce=debounce,
            max_wait=max_wait,
            batch=batch,
            after=after,
            after_policy=after_policy,
            fair_key=fair_key,
        )
        result = await self.queue.schedule_many([task], replace=replace)
        return str(result.ids[0])

    async def schedule_args(  # type: ignore[override]
        self,
        arguments: Mapping[str, Any],
        /,
        *,
        delay: Duration | None = None,
        at: datetime | None = None,
        id: str | None = None,  # the public API names it id
        replace: bool = False,
        priority: int | None = None,
        key: str | None = None,
        timeout: Duration | None = None,
        max_attempts: int | None = None,
        expires: Duration | datetime | None = None,
        debounce: Duration | None = None,
        max_wait: Duration | None = None,
        batch: str | None = None,
        after: Sequence[str] | None = None,
        after_policy: Literal["fail", "run"] = "fail",
        fair_key: str | None = None,
    ) -> str:
        """``schedule`` with the arguments as one mapping (see ``TaskFunction``)."""
        task = self.task(
            arguments,
            delay=delay,
            at=at,
            id=id,
            priority=priority,
            key=key,
            timeout=timeout,
            max_attempts=max_attempts,
            expires=expires,
            debounce=debounce,
            max_wait=max_wait,
            batch=batch,
            after=after,
            after_policy=after_policy,
            fair_key=fair_key,
        )
        result = await self.queue.schedule_many([task], replace=replace)
        return str(result.ids[0])


_NONE: Mapping[str, Any] = {}


def _routes(queues: Iterable[Any]) -> dict[str, Mapping[str, TaskFunction[Any, Any]]]:
    """Each queue's (and shard's) name -> its registry (live: later registrations count)."""
    return {shard: q.tasks for q in queues for shard in q.shard_names}


#: How deep ``_plainly_json`` looks before it leaves the judgement to ``result_entry``.
_PLAIN_DEPTH = 8


def _plainly_json(value: Any, depth: int = 0) -> bool:
    """True when ``value`` is JSON by its types alone (dicts with str keys, lists, str, int,
    bool, None, finite floats): a walk a few times cheaper than encoding it, which the ack
    does anyway. False means "not sure": ``result_entry`` judges (tuples, deep values)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return bool(value - value == 0.0)  # (NaN and the infinities give NaN)
    if depth >= _PLAIN_DEPTH:
        return False
    if kind is dict:
        return all(type(k) is str and _plainly_json(v, depth + 1) for k, v in value.items())
    if kind is list:
        return all(_plainly_json(v, depth + 1) for v in value)
    return False


def _bad_result(fn: TaskFunction[Any, Any], value: Any) -> Unrecoverable | None:
    """The error of a return value ``_plainly_json`` is not sure of that is not JSON (no retry
    changes it), else None (a JSON value too big to keep is acked with ``result_unstored``, as
    for any handler; so is a str with a lone surrogate, which the walk passes)."""
    _, why = result_entry(value)
    if why is None or not why.startswith("not JSON"):
        return None
    return Unrecoverable(f"task {fn.name!r} returned a value that is {why}")


class Dispatcher:
    """The handler of a worker for named tasks: a named task runs its registered function
    with the payload as keyword arguments (and its ``TaskContext`` first, ``context=True``)
    and returns its value (an ``async def`` function's coroutine is awaited by the consumer);
    a plain payload task goes to ``handler``. A name not registered on the delivery's queue,
    or a plain task without a handler, fails with ``UnknownTask``; arguments that do not bind
    with ``InvalidArguments``, a value that is not JSON with ``Unrecoverable``: all three end
    the task dead at once (see the module docstring)."""

    def __init__(
        self,
        queues: Iterable[Any],
        handler: Callable[[Any], Any] | None,
        loop: asyncio.AbstractEventLoop | None = None,
        batch: BatchSpec | None = None,
    ) -> None:
        self._routes = _routes(queues)
        self._handler = handler
        #: the consumer's event loop when an asyncio consumer runs this dispatcher on its
        #: handler threads: a plain durable function's steps are driven there
        self.loop = loop
        #: the plain handler's BatchSpec (``Worker(q, handler, batch=...)``): it is a bulk
        #: handler, called with a list of ``dueq.Item``
        self.batch = batch
        #: what ``bulk_of`` gives every plain payload task (None: they run alone)
        self.plain_bulk: tuple[Any, BatchSpec] | None = (
            None if batch is None else (PLAIN_BULK, batch)
        )
        #: some deliveries go to a bulk handler (the processors gather them: ``bulk_of``)
        self.bulk = batch is not None or any(
            fn.batch is not None for routes in self._routes.values() for fn in routes.values()
        )

    def bulk_of(self, d: Any) -> tuple[Any, BatchSpec] | None:
        """The bulk handler ``d`` goes to (what its calls are gathered by: the named task's
        function, or ``PLAIN_BULK``) with its BatchSpec; None when ``d`` runs alone (so does
        a delivery that cannot be dispatched: it fails alone, as it would)."""
        name = d.task_name
        if name is None:
            return self.plain_bulk
        fn = self._routes.get(d.queue_name, _NONE).get(name)
        if fn is None or fn.batch is None or type(d.payload) is not dict:
            return None
        return fn, fn.batch

    def run_bulk(self, group: Any, items: list[Any]) -> Any:
        """Call bulk handler ``group`` with ``items``; an ``async def`` one's coroutine is
        returned, to be awaited (then ``bulk_returned`` checks its value)."""
        call = self._handler if group is PLAIN_BULK else group.fn
        assert call is not None  # (bulk_of sends plain tasks here only with a handler)
        value = call(items)
        if inspect.isawaitable(value):
            return _bulk_checked(group, value)
        bulk_returned(group, value)
        return None

    def task_function(self, d: Any) -> TaskFunction[Any, Any]:
        """The registered function of named delivery ``d``; UnknownTask or InvalidArguments
        (a payload that is no dict)."""
        fn = self._routes.get(d.queue_name, {}).get(d.task_name)
        if fn is None:
            raise UnknownTask(
                f"no task named {d.task_name!r} is registered on queue {d.queue_name!r}",
                d.task_name,
            )
        if not isinstance(d.payload, dict):
            raise InvalidArguments(
                f"task {d.task_name!r}: payload is a {type(d.payload).__name__}, not a dict of "
                "arguments"
            )
        return fn

    def function(self, d: Any) -> Callable[..., Any]:
        """The function of named delivery ``d``, or UnknownTask."""
        return self.task_function(d).fn

    def plain(self, d: Any) -> Callable[[Any], Any]:
        if self._handler is None:
            raise UnknownTask(
                f"task {d.id!r} is a plain payload task (no name) and this worker has no handler"
            )
        return self._handler

    def __call__(self, d: Any) -> Any:
        name = d.task_name
        if name is None:
            handler = self._handler  # (plain(), inline: a call less per task)
            return (self.plain(d) if handler is None else handler)(d)
        fn = self._routes.get(d.queue_name, _NONE).get(name)
        payload = d.payload
        if fn is None or type(payload) is not dict:
            fn = self.task_function(d)  # (raises the error that says why)
        if fn.durable:
            return self.durable(fn, d, None)
        try:
            value = fn.fn(TaskContext(d), **payload) if fn.context else fn.fn(**payload)
        except TypeError:
            fn.check_arguments(payload)  # InvalidArguments when it was the binding
            raise  # (raised inside the function: an ordinary failure)
        if value is None or _plainly_json(value):
            return value
        if inspect.isawaitable(value):  # an async def function's: checked once awaited
            return _checked(fn, value)
        bad = _bad_result(fn, value)
        if bad is not None:
            raise bad
        return value

    def durable(
        self, fn: TaskFunction[Any, Any], d: Any, loop: asyncio.AbstractEventLoop | None
    ) -> Any:
        """Run durable ``fn`` for ``d`` with its step context (``loop``: the consumer's, when
        this plain function runs on a thread for an asyncio queue): its value once it returns
        past every committed step (an ``async def`` one's coroutine, checked once awaited);
        None when a sleep or a wait handed the task back (the delivery is settled then)."""
        payload = d.payload
        ctx = step_context(d, awaited=is_async(fn.fn), loop=loop or self.loop)
        try:
            value = fn.fn(ctx, **payload)
        except Suspended:  # handed back: settled as released, nothing to ack
            return None
        except TypeError:
            fn.check_arguments(payload)  # InvalidArguments when it was the binding
            raise  # (raised inside the function: an ordinary failure)
        if inspect.isawaitable(value):
            return _durable_checked(fn, ctx, value)
        ctx.finish()
        return _json_value(fn, value)


async def _durable_checked(fn: TaskFunction[Any, Any], ctx: Any, awaitable: Any) -> Any:
    """An ``async def`` durable function's value (see ``Dispatcher.durable``)."""
    try:
        value = await awaitable
    except Suspended:  # handed back: settled as released, nothing to ack
        return None
    ctx.finish()
    return _json_value(fn, value)


def _json_value(fn: TaskFunction[Any, Any], value: Any) -> Any:
    """``value``, or the Unrecoverable of a value that is not JSON (``_bad_result``)."""
    if value is not None and not _plainly_json(value):
        bad = _bad_result(fn, value)
        if bad is not None:
            raise bad
    return value


async def _checked(fn: TaskFunction[Any, Any], awaitable: Any) -> Any:
    value = await awaitable
    if value is not None and not _plainly_json(value):
        bad = _bad_result(fn, value)
        if bad is not None:
            raise bad
    return value


#: The group of a worker's plain bulk handler (``Worker(q, handler, batch=...)``).
PLAIN_BULK = "plain payload tasks"


def bulk_returned(group: Any, value: Any) -> None:
    """A bulk handler's return value: None, or the Unrecoverable that says how to give
    results (every item of the call goes dead: no retry makes it return otherwise)."""
    if value is None:
        return
    who = "the worker's handler" if group is PLAIN_BULK else f"task {group.name!r}"
    raise Unrecoverable(
        f"{who} is a bulk handler and returned {type(value).__name__}: it returns None and "
        "gives each item's result with item.result(value)"
    )


async def _bulk_checked(group: Any, awaitable: Any) -> None:
    bulk_returned(group, await awaitable)


class AsyncDispatcher(Dispatcher):
    """``Dispatcher`` as an ``async def`` handler, for consumers on an event loop whose
    functions are ``async def``: a plain function among them runs in the loop's default
    thread pool (so it cannot block the loop)."""

    async def __call__(self, d: Any) -> Any:
        if d.task_name is None:
            call: functools.partial[Any] = functools.partial(self.plain(d), d)
            return await call() if is_async(call.func) else await _in_thread(call)
        fn = self.task_function(d)
        if fn.durable and not is_async(fn.fn):  # on a thread, its steps driven on this loop
            loop = asyncio.get_running_loop()
            return await _in_thread(functools.partial(self.durable, fn, d, loop))
        if not is_async(fn.fn):  # the thread runs Dispatcher.__call__: binding, value checked
            return await _in_thread(functools.partial(super().__call__, d))
        if fn.durable:
            return await self.durable(fn, d, None)
        payload = d.payload
        try:
            awaitable = fn.fn(TaskContext(d), **payload) if fn.context else fn.fn(**payload)
        except TypeError:  # (an async def function raises only when its arguments do not bind)
            fn.check_arguments(payload)
            raise
        return await _checked(fn, awaitable)

    async def run_bulk(self, group: Any, items: list[Any]) -> Any:
        """``Dispatcher.run_bulk`` on the loop: a plain function runs on the loop's default
        thread pool."""
        call = self._handler if group is PLAIN_BULK else group.fn
        assert call is not None
        if is_async(call):
            value = await call(items)
        else:
            value = await _in_thread(functools.partial(call, items))
        bulk_returned(group, value)


async def _in_thread(call: Callable[[], Any]) -> Any:
    """``call()`` on the loop's default thread pool; an awaitable it returns is awaited."""
    result = await asyncio.get_running_loop().run_in_executor(None, call)
    if inspect.isawaitable(result):
        return await result
    return result


def is_async(fn: Any) -> bool:
    """True for ``async def`` functions and objects whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (a method lookup, not a callable test)
    )


def dispatcher(
    queues: Iterable[Any],
    handler: Callable[[Any], Any] | None,
    *,
    on_loop: bool,
    batch: BatchSpec | None = None,
) -> Dispatcher:
    """The handler a worker runs on ``queues`` (see ``Dispatcher``). ``on_loop``: the worker
    runs ``async def`` handlers on an event loop (``AsyncWorker``), so when every function
    (and ``handler``) is ``async def`` the dispatcher is one too; otherwise it is a plain
    function (run on handler threads; an ``async def`` function's coroutine is awaited).
    A ``handler`` that is a Dispatcher, or wraps one (``functools.wraps``: a metrics wrapper
    does), dispatches already and gets every delivery."""
    queues = list(queues)
    if handler is not None and isinstance(inspect.unwrap(handler), Dispatcher):
        return handler  # type: ignore[return-value]  # (it dispatches already: it gets all)
    loop = _running_loop() if on_loop else None
    if handler is not None:
        kind = AsyncDispatcher if is_async(handler) else Dispatcher
        return kind(queues, handler, loop, batch)
    if batch is not None:
        raise ConfigurationError(
            "batch= makes the worker's handler a bulk handler: give the handler too (named "
            "tasks take their own: @q.task(batch=dueq.BatchSpec(...)))"
        )
    functions = [fn.fn for q in queues for fn in q.tasks.values()]
    if on_loop and functions and all(is_async(fn) for fn in functions):
        return AsyncDispatcher(queues, None, loop)
    return Dispatcher(queues, None, loop)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # made outside a coroutine: its durable tasks get no loop
        return None
