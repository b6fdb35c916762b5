"""The Vertex service-account assertion, checked by an independent JWT
library (PyJWT, with `cryptography` for RS256), and the test key made.

    vertex_jwt.py keygen
        prints {"private_pem", "public_pem", "public_pkcs1_der_hex"} of a
        fresh RSA-2048 key.
    vertex_jwt.py verify PUBLIC_PEM CLIENT_EMAIL KID JWT
        verifies JWT's RS256 signature with PUBLIC_PEM and its claims
        (iss = sub = CLIENT_EMAIL, exp and iat present and valid, kid),
        prints {"header", "claims"}; exits 1 with the reason otherwise.
"""

import json
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def keygen():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key()
    public_pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    print(json.dumps({"private_pem": private_pem, "public_pem": public_pem, "public_pkcs1_der_hex": der.hex()}))


def verify(public_pem, client_email, kid, token):
    header = jwt.get_unverified_header(token)
    if header.get("kid") != kid:
        print(f"kid {header.get('kid')!r} is not {kid!r}")
        sys.exit(1)
    try:
        claims = jwt.decode(
            token,
            public_pem,
            algorithms=["RS256"],
            issuer=client_email,
            options={"require": ["exp", "iat", "iss", "sub"], "verify_aud": False},
        )
    except jwt.InvalidTokenError as e:
        print(f"invalid: {type(e).__name__}: {e}")
        sys.exit(1)
    if claims.get("sub") != client_email:
        print(f"sub {claims.get('sub')!r} is not {client_email!r}")
        sys.exit(1)
    print(json.dumps({"header": header, "claims": claims}))


if __name__ == "__main__":
    if sys.argv[1] == "keygen":
        keygen()
    else:
        verify(*sys.argv[2:6])
