// A second, independent gRPC client for the tests: @grpc/grpc-js (not grpc's C core) calling
// Triton's GRPCInferenceService. Usage: node grpc_client.js DESCRIPTOR_SET ADDRESS
// The service is loaded from a FileDescriptorSet the test writes from tritonclient's own
// descriptors. Prints one JSON object with what each call returned.
"use strict";
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const fs = require("fs");

const [descriptorPath, address] = process.argv.slice(2);
const definition = protoLoader.loadFileDescriptorSetFromBuffer(fs.readFileSync(descriptorPath),
  { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
const Service = grpc.loadPackageDefinition(definition).inference.GRPCInferenceService;
const client = new Service(address, grpc.credentials.createInsecure(),
  { "grpc.max_receive_message_length": -1, "grpc.max_send_message_length": -1 });

const call = (method, request) => new Promise((resolve) => {
  client[method](request, { deadline: Date.now() + 60000 }, (error, response) =>
    resolve(error ? { code: error.code, details: error.details } : response));
});

function floats(values) {
  return Buffer.from(new Float32Array(values).buffer);
}

function addRequest(id, a, b) {
  return {
    model_name: "add", id,
    inputs: [{ name: "A", datatype: "FP32", shape: [1, 3] }, { name: "B", datatype: "FP32", shape: [1, 3] }],
    raw_input_contents: [floats(a), floats(b)],
  };
}

function parameter(map, key) {
  // a protobuf map: an object, or (loaded from a descriptor set) a list of {key, value} entries
  return Array.isArray(map) ? map.find((e) => e.key === key).value : map[key];
}

function sum(response) {
  const raw = response.raw_output_contents[0];
  return Array.from(new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length)));
}

async function main() {
  const out = {};
  out.live = (await call("ServerLive", {})).live;
  const metadata = await call("ServerMetadata", {});
  out.server_name = metadata.name;
  const model = await call("ModelMetadata", { name: "add" });
  out.model_inputs = model.inputs.map((t) => `${t.name}:${t.datatype}:${t.shape.join("x")}`);
  out.infer = sum(await call("ModelInfer", addRequest("one", [1, 2, 3], [10, 20, 30])));
  // 1,000 calls in flight at once on this one channel
  const many = await Promise.all(Array.from({ length: 1000 }, (_, i) =>
    call("ModelInfer", addRequest(`c${i}`, [i, i, i], [1, 1, 1]))));
  out.many_ok = many.filter((r, i) => r.id === `c${i}` && sum(r)[0] === i + 1).length;
  // a bidirectional stream: three requests, three responses
  out.stream = await new Promise((resolve) => {
    const seen = [];
    const stream = client.ModelStreamInfer();
    stream.on("data", (r) => seen.push([r.infer_response.id, sum(r.infer_response)[0],
      parameter(r.infer_response.parameters, "triton_final_response").bool_param]));
    stream.on("error", (e) => resolve({ code: e.code, details: e.details }));
    stream.on("end", () => resolve(seen.sort()));
    for (let i = 0; i < 3; i++) stream.write(addRequest(`s${i}`, [i, 0, 0], [100, 0, 0]));
    stream.end();
  });
  out.error = await call("ModelMetadata", { name: "no_such_model" });
  // a tensor over 64 MiB each way, through the identity model (every other input one element)
  const n = (16 << 20) + 3;
  const big = new Float32Array(n).fill(1.5);
  big[n - 1] = 7;
  const sizes = { BOOL: 1, UINT8: 1, UINT16: 2, UINT32: 4, UINT64: 8, INT8: 1, INT16: 2, INT32: 4, INT64: 8,
    FP16: 2, FP64: 8, BF16: 2 };
  const inputs = [];
  const raw = [];
  for (const [datatype, size] of Object.entries(sizes)) {
    inputs.push({ name: `IN_${datatype}`, datatype, shape: [1] });
    raw.push(Buffer.alloc(size));
  }
  inputs.push({ name: "IN_FP32", datatype: "FP32", shape: [n] });
  raw.push(Buffer.from(big.buffer));
  inputs.push({ name: "IN_BYTES", datatype: "BYTES", shape: [1] });
  raw.push(Buffer.from([1, 0, 0, 0, 120]));
  const large = await call("ModelInfer", { model_name: "identity", id: "large", inputs, raw_input_contents: raw });
  if (large.raw_output_contents) {
    const i = large.outputs.findIndex((t) => t.name === "OUT_FP32");
    const c = large.raw_output_contents[i];
    out.large = { bytes: c.length, shape: large.outputs[i].shape.map(Number), first: c.readFloatLE(0),
      last: c.readFloatLE(c.length - 4) };
  } else {
    out.large = large;
  }
  client.close();
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
