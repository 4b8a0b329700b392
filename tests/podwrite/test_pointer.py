from gpuledger.podwrite.pointer import escape


def test_a_token_with_slashes_or_tildes_stays_one_token():
    assert escape("gpuledger.io/placement") == "gpuledger.io~1placement"
    assert escape("a~/b") == "a~0~1b"  # `~` first, or the `~1` written for `/` would read back as `~` + `1`
    assert escape("plain") == "plain"
    assert escape(3) == "3"
