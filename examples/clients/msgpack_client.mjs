// A Node.js client of troupe's msgpack protocol (docs/msgpack.md), with npm's @msgpack/msgpack.
//
//   troupe serve --msgpack-port 7200 &
//   node examples/clients/msgpack_client.mjs 127.0.0.1:7200 "Once upon a time" 40
//
// Prints one JSON object: the greedy completion (temperature 0), the same seeded request twice
// (the two texts are equal), the finish reason of a long request cancelled at its first chunk
// (a cancel frame) and the error frame answering a request with a misspelt key. All go over one
// connection, the two seeded requests in flight at once. tests/msgpack_test.cpp runs
// it. A frame is a 4-byte big-endian length and one msgpack value.
//
// A gateway with API keys and TLS (docs/security.md "Access to the gateways"):
//   TROUPE_API_KEY=KEY TROUPE_CA_FILE=ca.pem node examples/clients/msgpack_client.mjs ...
// connects over TLS, trusting the CA certificate of that file, and sends the key in its first
// frame.
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { createRequire } from 'node:module';

// Resolved through NODE_PATH as well as node_modules (an ES import ignores NODE_PATH).
const { encode, decode } = createRequire(import.meta.url)('@msgpack/msgpack');

// Seeds are 64-bit: decoded as BigInt when they do not fit a JavaScript number.
const codec = { useBigInt64: true };

export class TroupeClient {
  #socket;
  #buffer = Buffer.alloc(0);
  #pending = new Map();  // id -> { text, onChunk, resolve, reject }
  #nextId = 1;

  /// Connects to host:port: over TLS when `ca` (PEM text of the CA to trust) is given, and
  /// sends `key` in an auth frame first when one is given.
  static connect(host, port, { ca, key } = {}) {
    return new Promise((resolve, reject) => {
      const connected = () => {
        const client = new TroupeClient(socket);
        if (key) client.#send({ type: 'auth', key });
        resolve(client);
      };
      const socket = ca ? tls.connect({ host, port, ca }, connected) : net.connect({ host, port }, connected);
      socket.once('error', reject);
    });
  }

  constructor(socket) {
    this.#socket = socket;
    socket.on('data', (data) => this.#receive(data));
    socket.on('close', () => this.#failAll(new Error('the connection closed')));
  }

  /// Sends `request` (the fields of docs/msgpack.md); resolves with { text, end } at its end
  /// frame, rejects with { code, message } at its error frame. `onChunk` sees each chunk frame
  /// (its `id` is what `cancel` takes).
  complete(request, onChunk = () => {}) {
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { text: '', onChunk, resolve, reject });
      this.#send({ id, ...request });
    });
  }

  /// Sends the cancel frame of request `id`: it ends with finish_reason "cancelled".
  cancel(id) { this.#send({ type: 'cancel', id }); }

  close() { this.#socket.end(); }

  #send(frame) {
    const body = encode(frame, codec);
    const header = Buffer.alloc(4);
    header.writeUInt32BE(body.length);
    this.#socket.write(Buffer.concat([header, body]));
  }

  #receive(data) {
    this.#buffer = Buffer.concat([this.#buffer, data]);
    while (this.#buffer.length >= 4) {
      const length = this.#buffer.readUInt32BE(0);
      if (this.#buffer.length < 4 + length) return;
      this.#dispatch(decode(this.#buffer.subarray(4, 4 + length), codec));
      this.#buffer = this.#buffer.subarray(4 + length);
    }
  }

  #dispatch(frame) {
    // An error frame of no request (a refused key, say) ends them all.
    if (frame.id === null || frame.id === undefined) return this.#failAll({ code: frame.code, message: frame.message });
    const id = typeof frame.id === 'bigint' ? Number(frame.id) : frame.id;
    const request = this.#pending.get(id);
    if (!request) throw new Error(`a frame for no request in flight: ${JSON.stringify(frame)}`);
    if (frame.type === 'chunk') {
      request.text += frame.text;
      request.onChunk(frame);
      return;
    }
    this.#pending.delete(id);
    if (frame.type === 'end') request.resolve({ text: request.text, end: frame });
    else request.reject({ code: frame.code, message: frame.message });
  }

  #failAll(error) {
    for (const request of this.#pending.values()) request.reject(error);
    this.#pending.clear();
  }
}

async function main() {
  const [address, prompt, maxTokens] = process.argv.slice(2);
  const [host, port] = [address.slice(0, address.lastIndexOf(':')), Number(address.slice(address.lastIndexOf(':') + 1))];
  const max_tokens = Number(maxTokens);
  const ca = process.env.TROUPE_CA_FILE ? fs.readFileSync(process.env.TROUPE_CA_FILE) : undefined;
  const client = await TroupeClient.connect(host, port, { ca, key: process.env.TROUPE_API_KEY });
  const error = await client.complete({ prompt, tempurature: 0 }).then(() => null, (e) => e);
  // The connection outlives the error frame: the next requests go over it.
  const greedy = await client.complete({ prompt, max_tokens, temperature: 0 });
  const seededRequest = () => client.complete({ prompt, max_tokens, temperature: 1, top_p: 1, seed: 42 });
  const seeded = await Promise.all([seededRequest(), seededRequest()]);
  const long = { prompt, max_tokens: 500, ignore_eos: true, temperature: 0 };
  const cancelled = await client.complete(long, (chunk) => { if (chunk.sequence === 0) client.cancel(chunk.id); });
  client.close();
  console.log(JSON.stringify({
    greedy: greedy.text,
    finishReason: greedy.end.finish_reason,
    seeded: seeded.map((r) => r.text),
    seeds: seeded.map((r) => String(r.end.seed)),
    cancelled: cancelled.end.finish_reason,
    error,
  }));
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
