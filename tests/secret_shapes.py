"""Secrets by shape: one made-up credential per provider family, for the egress tests.

Every value below is invented, with the published shape of its provider's credentials
(prefix, alphabet, length), so a redactor that knows the shape hides it whatever name it
is printed under. ``SHAPES`` is what a test plants (in stdout, stderr, an exception, the
environment, arguments, the spec); ``needle`` is what it then searches for in everything
acceptrun wrote, served, archived or sent: a part that only the secret holds (for a key
block, a line of its body, which the redactor must hide with its header).

    for shape in SHAPES:
        assert shape.needle not in text, shape.family
"""

from __future__ import annotations

import dataclasses

__all__ = ["SHAPES", "Shape", "plant_text"]


@dataclasses.dataclass(frozen=True)
class Shape:
    family: str  # who issues it: "github", "huggingface", "aws", "pem", ...
    text: str  # the whole of what a workload prints
    needle: str  # what must never appear in anything acceptrun writes

    def __str__(self) -> str:
        return self.family


def _shape(family: str, secret: str, *, say: str = "{}") -> Shape:
    return Shape(family, say.format(secret), secret)


_PEM_BODY = (
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
    "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n"
    "LxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW/VDL5AaWTg0nLVkjRo\n"
)
_SSH_BODY = (
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACDXqVtGJ5pqwLlnYnC8RLq0QHq2P6V0aJ3mq8bq7gHXTQAAAJh1Xq9RdV6v\n"
)

SHAPES: tuple[Shape, ...] = (
    # source control
    _shape("github classic", "ghp_" + "R8kqZ2vT5mXw1yB7nC3dF6gH9jK0lP4sQ2aE", say="token {}"),
    _shape("github fine-grained", "github_pat_11ABCDEFG0" + "x7Yq" * 19 + "Zz"),
    _shape("gitlab", "glpat-" + "k3J9xQ2mP7vR4tW8yZ1b", say="GITLAB={} "),
    # model hubs and LLM APIs
    _shape("huggingface", "hf_" + "QxLmNoPqRsTuVwXyZaBcDeFgHiJkLmNoPq"),
    _shape(
        "openai project",
        "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" + "T3BlbkFJ" + "Zy4xWv1uTs8rQp5oNm2lKj9i",
    ),
    _shape("anthropic", "sk-ant-api03-" + "Qw8eRt5yUi2oPa7sDf4gHj1kLz6xCv3bNm9" * 2 + "-AbCdAA"),
    # chat
    _shape("slack bot", "xoxb-" + "2804417123-4415526234512-" + "aB3cD4eF5gH6iJ7kL8mN9oP0"),
    _shape("discord bot", "MTA4OTY3NjU0MzIxMDk4NzY1NA.GhXyZa.Qw8eRt5yUi2oPa7sDf4gHj1kLz6xCv3bNm9q"),
    _shape("telegram bot", "5824416139:" + "AAGq9rT2xVbN4mK7pL1zW8yC3dF6hJ0sEaQ"),
    # clouds
    _shape("aws access key id", "AKIA" + "Q3EGRQ7Z5XN2KTWB", say="aws_access_key_id {}"),
    _shape(
        "aws secret in a line", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ8vT4nB2k", say="aws secret '{}'"
    ),
    _shape("google api key", "AIza" + "SyD3kq9Xv2LmP7rT4wY8zB1nC5fG6hJ0qR"),
    _shape(
        "azure storage",
        "AccountKey=" + "q7Zk3Xw9mP2rT5yV8bN1cF4gH6jL0sD3aE7uI9oK2pQ5wX8zB1nM4vC7fG0hJ3kLq==",
        say="{}",
    ),
    # package registries and payment
    _shape("npm", "npm_" + "Xk4Lm9Pq2Rs7Tv3Wy8Zb1Cd5Ef0Gh6Ij4Kl2"),
    _shape(
        "pypi",
        "pypi-AgEIcHlwaS5vcmcCJD" + "k3J9xQ2mP7vR4tW8yZ1bN5cF6gH0jL3sD7aE2uI9oK4pQ1wX6zB" * 2,
    ),
    _shape("stripe", "sk_live_" + "51Hq8rT2xVbN4mK7pL1zW8yC"),
    _shape(
        "sendgrid",
        "SG." + "kZq8rT2xVbN4mK7pL1zW8y" + "." + "Cd3F6hJ0sEaQkZq8rT2xVbN4mK7pL1zW8yCd3F6hJ0s",
    ),
    # tokens with structure
    _shape(
        "jwt",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
        ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
        ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    ),
    Shape(
        "pem private key",
        f"-----BEGIN RSA PRIVATE KEY-----\n{_PEM_BODY}-----END RSA PRIVATE KEY-----",
        "LxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW",
    ),
    Shape(
        "openssh private key",
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{_SSH_BODY}-----END OPENSSH PRIVATE KEY-----",
        "QyNTUxOQAAACDXqVtGJ5pqwLlnYnC8RLq0QHq2P6V0aJ3mq8bq7gHXTQ",
    ),
    # a header of any scheme, any case
    _shape(
        "authorization token", "9f3b1c7e2a4d6f8091b3c5d7e9f1a3b5", say="Authorization: token {}"
    ),
    _shape(
        "authorization digest",
        "d41f8cd98f00b204e9800998ecf8427e",
        say="authorization: Digest response={}",
    ),
)


def plant_text() -> str:
    """Every shape, one a line: what a hostile workload prints."""
    return "\n".join(s.text for s in SHAPES)
