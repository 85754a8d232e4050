"""Fewer round trips into the JVM while PySpark builds the analysis's plans.

A small analysis built its plans with about 15,000 py4j calls, each a
round trip to the driver's JVM, and most of them asked nothing new (about
4,600 are left, docs/performance-analysis.md):

* PySpark finds each column function by looking up
  `org.apache.spark.sql.functions` on the JVM view, then the function on that
  class: two reflection calls before the call itself (4,700 in a small
  analysis);
* each list of columns (or of names) crosses as a java.util.ArrayList that
  py4j fills one element per call (2,400 calls);
* a column by name (`F.col`, and every column named by a string) is a call
  of its own each time, and so is the release of the JVM object it returns
  once Python drops it: about 1,700 of each in a small analysis, for a few
  hundred names.

`pin_jvm_names` answers the look-ups in Python after the first, keeps the
column of each name (and each plain literal) once asked for, and installs a
list conversion that crosses in a few calls. The classes, methods and lists
the JVM receives are the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from py4j.java_gateway import JavaClass, JavaMember, JavaObject

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: JVM classes PySpark looks up by name (short or qualified) for each column it builds.
PINNED_JVM_NAMES = {
    "functions": "org.apache.spark.sql.functions",
    "PythonUtils": "org.apache.spark.api.python.PythonUtils",
    "PythonSQLUtils": "org.apache.spark.sql.api.python.PythonSQLUtils",
}

#: Static methods whose result for the same plain arguments can be handed out again: a JVM Column
#: is immutable, and the one for a name (an unresolved attribute) or a literal is the same wherever used.
REUSED_RESULTS = {"org.apache.spark.sql.functions": frozenset({"col", "lit"})}
#: Arguments that make a result reusable, by exact type (True and 1 are equal keys otherwise; a float
#: may be NaN, which equals nothing).
PLAIN_ARGUMENTS = frozenset({str, int, bool, type(None)})
#: Results kept per method, at most: names and literals are few, but a long-lived session (the warm
#: engine, a test run) could meet literals without end.
MAX_REUSED = 4096

#: java.util.List.of takes up to ten elements without an array.
LIST_OF_ARITY = 10


class StaticMethods:
    """A JVM class whose static methods are found once each: py4j asks the JVM
    what a class's member is on every attribute access. Anything that is not
    a method (a field's value may change) is asked for every time."""

    def __init__(self, java_class: JavaClass) -> None:
        self._class = java_class
        self._fqn = java_class._fqn
        self._methods: dict[str, Any] = {}
        self._reused = REUSED_RESULTS.get(self._fqn, frozenset())

    def __getattr__(self, name: str) -> Any:
        method = self._methods.get(name)
        if method is None:
            member = getattr(self._class, name)
            if not isinstance(member, JavaMember):
                return member
            method = self._methods[name] = ReusedResults(member) if name in self._reused else member
        return method

    def __call__(self, *args: Any) -> Any:
        return self._class(*args)


class ReusedResults:
    """A static JVM method whose result is asked for once per plain arguments (REUSED_RESULTS)."""

    __slots__ = ("_member", "_results")

    def __init__(self, member: JavaMember) -> None:
        self._member = member
        self._results: dict[tuple, Any] = {}

    def __call__(self, *args: Any) -> Any:
        if not all(type(arg) in PLAIN_ARGUMENTS for arg in args):
            return self._member(*args)
        key = tuple((type(arg), arg) for arg in args)
        found = self._results.get(key)
        if found is None:
            found = self._member(*args)
            if len(self._results) < MAX_REUSED:
                self._results[key] = found
        return found


class ObjectListConverter:
    """py4j's conversion of a Python list of JVM objects or strings (PySpark's
    lists of columns, of column names) to a java.util.ArrayList, in one call
    per ten elements instead of one per element. Lists holding anything else
    (None, numbers) are left to py4j's own converter, which comes after this one."""

    def __init__(self, gateway_client: Any) -> None:
        self._new_list = JavaClass("java.util.ArrayList", gateway_client)
        self._list_of = StaticMethods(JavaClass("java.util.List", gateway_client))

    def can_convert(self, value: Any) -> bool:
        # py4j's own conversion is a call for the list and one per element: for one element as
        # many calls as this one's two (List.of, the ArrayList), from two elements on more.
        return isinstance(value, list) and len(value) >= 2 and all(isinstance(v, (JavaObject, str)) for v in value)

    def convert(self, value: list, gateway_client: Any) -> JavaObject:
        chunks = [value[i:i + LIST_OF_ARITY] for i in range(0, len(value), LIST_OF_ARITY)]
        # A mutable ArrayList, as py4j's own converter gives: the receiving method may change it.
        java_list = self._new_list(self._list_of.of(*chunks[0]))
        for chunk in chunks[1:]:
            java_list.addAll(self._list_of.of(*chunk))
        return java_list


def pin_jvm_names(session: SparkSession) -> None:
    """Keep PySpark's JVM classes (by short and qualified name) on the
    session's JVM view with their methods found once, and convert lists of
    columns in a few calls (the module's docstring says why)."""
    context = session.sparkContext
    jvm = context._jvm
    for short, qualified in PINNED_JVM_NAMES.items():
        existing = vars(jvm).get(qualified)
        methods = existing if isinstance(existing, StaticMethods) else StaticMethods(getattr(jvm, qualified))
        setattr(jvm, short, methods)
        setattr(jvm, qualified, methods)
    client = context._gateway._gateway_client
    converters = client.converters
    if converters is not None and not any(isinstance(c, ObjectListConverter) for c in converters):
        converters.insert(0, ObjectListConverter(client))
