import pytest

from slca_exp.registry import DuplicateNameError, Registry, UnknownNameError


def test_register_get_names_and_decorator_form():
    reg: Registry[object] = Registry("widget")
    reg.register("b", 2)

    @reg.register("a")
    def a():
        return 1

    assert reg.get("a") is a and reg.get("b") == 2
    assert reg.names() == ["a", "b"] and "a" in reg and len(reg) == 2 and list(reg) == ["a", "b"]


def test_duplicate_name_is_an_error_naming_the_holder():
    reg: Registry[object] = Registry("widget")
    reg.register("x", len)
    with pytest.raises(DuplicateNameError, match="widget 'x' is already registered"):
        reg.register("x", 3)
    assert reg.get("x") is len


def test_unknown_name_lists_known_names_and_suggests():
    reg: Registry[int] = Registry("widget")
    reg.register("alpha", 1)
    reg.register("beta", 2)
    with pytest.raises(UnknownNameError) as err:
        reg.get("alpah")
    assert str(err.value) == (
        "unknown widget 'alpah'. Did you mean 'alpha'? Known widgets: alpha, beta"
    )
    with pytest.raises(UnknownNameError, match=r"Known widgets: \(none\)"):
        Registry("widget").get("x")


def test_names_must_be_strings():
    with pytest.raises(TypeError):
        Registry("widget").register("", 1)
