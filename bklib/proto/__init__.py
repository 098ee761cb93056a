"""Generated protobuf code for our own .proto files, and wire framing."""
