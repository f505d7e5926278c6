from inferentia_operator.core.drift import applied, quantity


def test_extra_live_fields_do_not_count():
    assert applied({"a": 1, "b": {"c": "x"}}, {"a": 1, "b": {"c": "x", "d": 2}, "e": 3})


def test_a_changed_or_missing_field_counts():
    assert not applied({"a": 1}, {"a": 2})
    assert not applied({"a": 1}, {})
    assert not applied({"l": [1, 2]}, {"l": [1]})


def test_quantities_compare_as_numbers_under_resources():
    desired = {"resources": {"requests": {"hugepages-2Mi": "1024Mi", "cpu": "0.5"}}}
    assert applied(desired, {"resources": {"requests": {"hugepages-2Mi": "1Gi", "cpu": "500m"}}})
    assert not applied(desired, {"resources": {"requests": {"hugepages-2Mi": "2Gi", "cpu": "500m"}}})
    assert not applied({"image": "1Gi"}, {"image": "1024Mi"})  # only resource lists are quantities


def test_empty_values_the_api_server_omits_are_equal_to_absent():
    assert applied({"env": [{"name": "A", "value": ""}]}, {"env": [{"name": "A"}]})
    assert not applied({"env": [{"name": "A", "value": "x"}]}, {"env": [{"name": "A"}]})


def test_quantity_parsing():
    assert quantity("1Gi") == quantity("1024Mi") == 2**30
    assert quantity("500m") == quantity("0.5")
    assert quantity("2") == quantity(2)
    assert quantity("lots") is None and quantity(True) is None
