'use strict';
// CRC-32 (IEEE 802.3, the polynomial of zlib.crc32 in Python): a task's shard is
// crc32(utf-8 bytes of its id) mod the shard count (docs/protocol.md, "Shards").

const TABLE = new Uint32Array(256);
for (let n = 0; n < 256; n++) {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  TABLE[n] = c >>> 0;
}

/** CRC-32 of a Buffer (or Uint8Array), as an unsigned 32-bit integer. */
function crc32(bytes) {
  let crc = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) crc = TABLE[(crc ^ bytes[i]) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

module.exports = { crc32 };
