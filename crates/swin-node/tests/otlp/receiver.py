"""An OTLP/gRPC trace receiver: OpenTelemetry's published protos (opentelemetry-proto)
served by grpcio, nothing of swin's. Serves TraceService/Export on 127.0.0.1:<port> and
prints every span it receives as one JSON line on stdout:

    {"service": ..., "trace_id": hex, "span_id": hex, "parent_span_id": hex or "",
     "name": ..., "kind": int, "attributes": {key: value}}

Usage: receiver.py PORT
"""

import json
import sys
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value", "bytes_value"):
        return str(getattr(v, kind))
    return getattr(v, kind)


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        for resource_spans in request.resource_spans:
            resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    print(
                        json.dumps(
                            {
                                "service": resource.get("service.name"),
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "name": span.name,
                                "kind": span.kind,
                                "attributes": {a.key: value(a.value) for a in span.attributes},
                            }
                        ),
                        flush=True,
                    )
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    port = int(sys.argv[1])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
