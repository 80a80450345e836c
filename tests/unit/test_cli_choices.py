"""The CLI spells out family and size names so that parsing flags stays fast; they must not drift."""

import argparse

from epd import cli
from epd.tiny import families


def test_cli_family_and_size_choices_match_the_generator():
    assert sorted(cli.FAMILY_NAMES) == sorted(families.FAMILIES)
    assert cli.SIZES == families.SIZES


def test_every_service_command_is_registered():
    assert set(cli.SERVICE_MODULES) == {"encoder", "prefill", "decode", "colocated", "router"}



def test_serve_hands_its_engine_flags_to_the_workers():
    from epd.engine_args import passed_engine_args

    args = cli.build_parser().parse_args(["serve", "--kernels", "torch", "--kv-cache-mb", "256"])
    assert passed_engine_args(args) == ("--kv-cache-mb", "256", "--kernels", "torch")
    assert passed_engine_args(cli.build_parser().parse_args(["serve"])) == ()  # unset: the workers' own defaults


def test_an_encoder_takes_the_kernels_flag_only_and_parses_it():
    from encoder_svc.main import add_arguments
    from epd.engine_args import passed_to

    passed = ("--kv-cache-mb", "256", "--kernels", "torch", "--max-running", "8")
    assert passed_to("encoder", passed) == ("--kernels", "torch")
    assert passed_to("encoder", ("--kv-blocks", "64")) == ()
    assert passed_to("decode", passed) == passed and passed_to("colocated", passed) == passed
    assert passed_to("router", passed) == ()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--kernels", "native"]).kernels == "native"
    assert parser.parse_args([]).kernels == "auto"
