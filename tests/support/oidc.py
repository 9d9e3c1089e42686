"""A real OpenID provider for the sign-in tests: oidc-provider (npm) run with node on a loopback port.

The provider's signing keys are made here, so that a test can also sign tokens with exactly the key the
provider publishes (a claim of the wrong type, another audience) and with keys it does not publish.
"""

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from .processes import free_port, stop_process, wait_until_answering

REPOSITORY = Path(__file__).resolve().parents[2]
PROVIDER_DIR = REPOSITORY / ".cache" / "oidc-provider"
SCRIPT = Path(__file__).with_name("oidc_provider.mjs")
AUDIENCE = "zarr-gateway-api"


def install() -> Path:
    """The package's directory, installed first if it is not there yet."""
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider" / "package.json").exists():
        subprocess.run([str(REPOSITORY / "scripts" / "install-oidc-provider")], check=True)
    return PROVIDER_DIR


@dataclass
class SigningKey:
    kid: str
    private: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))

    def jwk(self) -> dict[str, Any]:
        entry: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(self.private))
        return {**entry, "kid": self.kid, "alg": "RS256", "use": "sig"}

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        return jwt.encode(claims, self.private, algorithm="RS256", headers={"kid": self.kid, **header})


@dataclass
class Provider:
    issuer: str
    port: int
    keys: list[SigningKey]
    config_path: Path
    log_path: Path
    redirect_uris: list[str] = field(default_factory=list)  # the gateway's /callback
    process: "subprocess.Popen[bytes] | None" = None

    def start(self) -> "Provider":
        config = {
            "issuer": self.issuer,
            "port": self.port,
            "audience": AUDIENCE,
            "keys": [key.jwk() for key in self.keys],  # private: the provider publishes their public halves
            "clients": [*CLIENTS, gateway_client(self.redirect_uris)],
            "accounts": ACCOUNTS,
            "client_claims": CLIENT_CLAIMS,
        }
        self.config_path.write_text(json.dumps(config))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["node", str(SCRIPT), str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"OIDC_PROVIDER_DIR": str(install()), "PATH": "/usr/local/bin:/usr/bin:/bin", "NODE_ENV": "test"},
            )
        wait_until_answering(
            f"{self.issuer}/.well-known/openid-configuration", self.process, 60, self.log_path.read_text
        )
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def restart(self, keys: list[SigningKey]) -> None:
        """The same issuer at the same port with other signing keys (a key rotation)."""
        self.stop()
        self.keys = keys
        self.start()

    def client_token(self, client_id: str = "script", secret: str = "script-secret") -> str:
        """A JWT access token for the gateway, from the client credentials grant (the client's claims)."""
        answer = requests.post(
            f"{self.issuer}/token",
            data={"grant_type": "client_credentials", "scope": "read"},
            auth=(client_id, secret),
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        token: str = answer.json()["access_token"]
        assert token.count(".") == 2, "the provider's access tokens are JWTs"
        return token

    def forged(self, key: SigningKey | None = None, **claims: Any) -> str:
        """A token signed with ``key`` (the provider's first by default), valid and granted the lab-a group unless
        ``claims`` say otherwise (a claim given as None is left out)."""
        now = int(time.time())
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "lab-a-person", "iat": now, "exp": now + 300}
        body["groups"] = ["lab-a"]
        body.update(claims)
        return (key or self.keys[0]).sign({k: v for k, v in body.items() if v is not None})


def signin_settings(provider: Provider, directory: Path, policy: dict[str, Any]) -> dict[str, object]:
    """The settings of a gateway that signs in with ``provider``, granting by ``policy`` (the tokens file)."""
    policy_path = directory / "policy.json"
    policy_path.write_text(json.dumps(policy))
    secret = directory / "client-secret"
    secret.write_text(GATEWAY_SECRET + "\n")
    return {
        "tokens_file": policy_path,
        "oidc_issuer": provider.issuer,
        "oidc_client_id": GATEWAY_CLIENT,
        "oidc_client_secret_file": secret,
        "oidc_audience": AUDIENCE,
        "oidc_scope": "openid email profile groups",
        "oidc_logout_dir": directory / "logouts",
    }


def provider_at(directory: Path, keys: list[SigningKey] | None = None) -> Provider:
    """A provider on a port of its own, not started yet: the gateway it serves needs its address first (the
    gateway reads the discovery document on first use), and the provider the gateway's callback."""
    port = free_port()
    return Provider(
        f"http://127.0.0.1:{port}",
        port,
        keys or [SigningKey("first")],
        directory / "oidc-provider.json",
        directory / "oidc-provider.log",
    )


GATEWAY_CLIENT = "zarr-gateway"
GATEWAY_SECRET = "gateway-client-secret"
# Accounts of the provider's login form: any password signs them in.
ACCOUNTS: dict[str, dict[str, Any]] = {
    "ada": {"email": "ada@lab-a.example", "email_verified": True, "groups": ["lab-a"], "name": "Ada"},
    "bob": {"email": "bob@elsewhere.example", "email_verified": True, "groups": ["visitors"], "name": "Bob"},
}
CLIENT_CLAIMS: dict[str, dict[str, Any]] = {
    "script": {"groups": ["lab-a"], "email": "robot@lab-a.example"},
    "outsider": {"groups": ["visitors"]},
}
CLIENTS: list[dict[str, Any]] = [
    {
        "client_id": "script",
        "client_secret": "script-secret",
        "grant_types": ["client_credentials"],
        "response_types": [],
        "redirect_uris": [],
    },
    {
        "client_id": "outsider",
        "client_secret": "outsider-secret",
        "grant_types": ["client_credentials"],
        "response_types": [],
        "redirect_uris": [],
    },
]


def gateway_client(redirect_uris: list[str]) -> dict[str, Any]:
    return {
        "client_id": GATEWAY_CLIENT,
        "client_secret": GATEWAY_SECRET,
        "grant_types": ["authorization_code"],
        "response_types": ["code"],
        "redirect_uris": redirect_uris,
    }
