"""One ShouldRateLimit over TLS as Python's grpcio sends it (Envoy's protos from xds-protos):
domain "api", one descriptor key=k. Prints the overall code (OK or OVER_LIMIT) and the
descriptor's limit_remaining, or "error: CODE" when the call fails (exit 3). Run by
tests/tls/grpc.rs.

usage: client.py HOST:PORT CA_PEM [CLIENT_CERT_PEM CLIENT_KEY_PEM]
"""

import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main(target, ca, cert=None, key=None):
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(ca),
        private_key=read(key) if key else None,
        certificate_chain=read(cert) if cert else None,
    )
    with grpc.secure_channel(target, creds) as channel:
        rls = rls_pb2_grpc.RateLimitServiceStub(channel)
        request = rls_pb2.RateLimitRequest(
            domain="api",
            descriptors=[
                ratelimit_pb2.RateLimitDescriptor(
                    entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value="v")]
                )
            ],
        )
        try:
            answer = rls.ShouldRateLimit(request, timeout=5)
        except grpc.RpcError as e:
            print(f"error: {e.code().name} {e.details()}")
            sys.exit(3)
        code = rls_pb2.RateLimitResponse.Code.Name(answer.overall_code)
        print(f"{code} {answer.statuses[0].limit_remaining}")


if __name__ == "__main__":
    main(*sys.argv[1:])
