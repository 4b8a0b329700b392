from gpuledger.podwrite.visibility.variables import annotation_ref


def test_a_reference_to_an_annotation_reads_back_as_the_api_server_stores_it():
    assert annotation_ref("a/b") == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations['a/b']"}
    }
