"""The shared registry machinery (``lime_arch.specs``), on registries made here: names, the
declared-name table, lookups and their one-line errors, and spec strings under both argument
policies. The registries built on it are tested with their entries (test_routers.py,
test_depth_mix.py, tests/orchestrator/engine/test_data.py, tests/orchestrator/tasks/)."""
import pytest

from lime_arch.errors import ConfigError
from lime_arch.specs import OptionalArg, Registry, RequiredArg, SpecRegistry, spec_string, split_spec


@pytest.mark.parametrize("spec,split", [
    ("full", ("full", [])), ("first-4", ("first", ["4"])), ("first-04", ("first", ["04"])),
    ("no-head-mix", ("no-head-mix", [])), ("hyper-connections-static-2", ("hyper-connections-static", ["2"])),
    ("scaled-0.5", ("scaled", ["0.5"])), ("strided-1-2", ("strided", ["1", "2"])),
    ("last-x-2", ("last-x", ["2"])), ("top2-4", ("top2", ["4"])),
    ("first--1", None), ("first-2-x", None), ("First-4", None), ("4", None), ("", None), ("first-", None),
    ("first-1e3", None),
])
def test_split_spec(spec, split):
    assert split_spec(spec) == split


def test_registry_names_lookup_and_errors():
    reg = Registry("widget", key="model.widget")
    reg.add("b-one", 1)
    reg.register("a-two")(2)
    assert list(reg) == ["b-one", "a-two"] and reg.lookup("a-two") == 2
    for bad in ("Big", "x-2", "a--b", 3):
        with pytest.raises(ValueError, match="lowercase words joined by '-', none of them all digits"):
            reg.add(bad, 0)
    with pytest.raises(ValueError, match=r"widget name 'b-one' is registered already \(by int\)"):
        reg.add("b-one", 5)
    with pytest.raises(ConfigError) as e:
        reg.lookup("c")
    assert str(e.value) == "model.widget: unknown widget 'c'; allowed: b-one, a-two"
    srt = Registry("task", sort=True)
    srt.add("zeta", 0)
    srt.add("alpha", 0)
    assert str(srt.unknown("x")) == "unknown task 'x'; allowed: alpha, zeta"
    twin = reg.copy()
    twin.add("c", 3)
    assert type(twin) is Registry and "c" not in reg and twin.key == "model.widget"


def test_declared_names_are_the_one_table():
    reg = Registry("source", key="data.source", declared=("text", "hf"))
    reg.require("hf")  # known before anything is registered
    assert reg.missing() == ["text", "hf"]
    with pytest.raises(ConfigError) as e:
        reg.require("wiki")
    assert str(e.value) == "data.source: unknown source 'wiki'; allowed: text, hf"
    with pytest.raises(ValueError, match="source name 'wiki' is not declared; declared: text, hf"):
        reg.add("wiki", 0)
    reg.add("hf", 1)
    assert reg.missing() == ["text"]
    with pytest.raises(ConfigError, match="unknown source 'text'"):
        reg.lookup("text")  # declared, but its module never registered it
    with pytest.raises(ValueError, match="lowercase words"):
        Registry("source", declared=("Text",))


class Base:
    arguments = ()


def test_required_arguments():
    reg = SpecRegistry("gadget", key="model.gadget", base=Base, arg_class=RequiredArg, reserved={"name"})

    @reg.register("plain")
    class Plain(Base):
        pass

    @reg.register("pair")
    class Pair(Base):
        arguments = (RequiredArg("a"), RequiredArg("b", float, 0.5))

    assert Plain.name == "plain" and reg.listing() == "plain, pair-<int>-<float>"
    assert reg.parse("plain") == (Plain, ()) and reg.parse("pair-2-0.25") == (Pair, (2, 0.25))
    assert reg.specs() == ["plain", "pair-4-0.5"] and reg.specs((3,)) == ["plain", "pair-3-3.0"]
    assert spec_string("pair", (2, 0.25)) == "pair-2-0.25"
    for spec, message in [
        ("pair", "model.gadget: 'pair' needs 2 arguments (<a>-<b>), e.g. pair-4-0.5"),
        ("pair-0-1", "model.gadget: 'pair-0-1' needs a positive integer for a, got 0"),
        ("pair-1-0.0", "model.gadget: 'pair-1-0.0' needs a positive number for b, got 0.0"),
        ("pair-1", "model.gadget: unknown gadget 'pair-1'; registered: plain, pair-<int>-<float>"),
        ("pair-1.5-2", "model.gadget: unknown gadget 'pair-1.5-2'; registered: plain, pair-<int>-<float>"),
        ("plain-3", "model.gadget: unknown gadget 'plain-3'; registered: plain, pair-<int>-<float>"),
        (None, "model.gadget: must be a string, got None; registered: plain, pair-<int>-<float>"),
    ]:
        with pytest.raises(ConfigError) as e:
            reg.parse(spec)
        assert str(e.value) == message
    with pytest.raises(ValueError, match="argument name 'name' is not a free identifier"):
        reg.register("clash")(type("Clash", (Base,), {"arguments": (RequiredArg("name"),)}))
    with pytest.raises(ValueError, match="needs a positive int example"):
        reg.register("zero")(type("Zero", (Base,), {"arguments": (RequiredArg("k", int, 0),)}))
    with pytest.raises(TypeError, match="arguments must be a tuple of RequiredArg"):
        reg.register("opt")(type("Opt", (Base,), {"arguments": (OptionalArg("k", 1),)}))
    assert list(reg) == ["plain", "pair"]


def test_optional_arguments():
    reg = SpecRegistry("mix", key="model.mix", base=Base, arg_class=OptionalArg, reserved=())

    @reg.register("dwa")
    class Dwa(Base):
        arguments = (OptionalArg("dilation", 1), OptionalArg("scale", 2.0, float))

    assert reg.listing() == "dwa[-<dilation>[-<scale>]]" and reg.specs() == ["dwa"]
    assert reg.parse("dwa") == (Dwa, (1, 2.0)) and reg.parse("dwa-3") == (Dwa, (3, 2.0))
    assert reg.parse("dwa-3-0.5") == (Dwa, (3, 0.5))
    for spec, message in [
        ("dwa-1-2-3", "model.mix: 'dwa-1-2-3': dwa takes at most 2 argument(s), dwa[-<dilation>[-<scale>]]; "
                      "registered: dwa[-<dilation>[-<scale>]]"),
        ("dwa-1.5", "model.mix: 'dwa-1.5' needs a positive integer for dilation, got 1.5"),
        ("dwa-00", "model.mix: 'dwa-00' needs a positive integer for dilation, got 00"),
        ("dwa-x", "model.mix: unknown mix 'dwa-x'; registered: dwa[-<dilation>[-<scale>]]"),
    ]:
        with pytest.raises(ConfigError) as e:
            reg.parse(spec)
        assert str(e.value) == message
