'use strict';
// A queue on a Redis Cluster (docs/protocol.md, "On a Redis Cluster"): a script call goes to
// the primary of its first key's slot, through the cluster client of the npm package
// `redis` (createCluster), which follows MOVED and ASK; the script cache is per node, so a
// NOSCRIPT is answered by loading the script on the slot's owner.

// Errors of a call the cluster did not run, sent again after a pause: TRYAGAIN (a multi-key
// call on a slot being migrated, with its keys on both sides) and CLUSTERDOWN (no node
// serves the slot, as during a failover). 7 times, after 100 ms doubling to 1 s: ~4.5 s in
// all, the backoff of delayq's Python producer (runner.py, CLUSTER_TRIP_ATTEMPTS).
const RESEND = ['TRYAGAIN', 'CLUSTERDOWN'];
const RESENDS = 7;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Whether ``client`` is a cluster client of the npm package `redis` (createCluster). */
function isCluster(client) {
  return (
    client != null &&
    typeof client.nodeClient === 'function' &&
    typeof client.sendCommand === 'function' &&
    Array.isArray(client.masters)
  );
}

const CLUSTER_URL = /^(rediss?)\+cluster:\/\/(?:([^@/]*)@)?([^/?#]+)(?:\/(\d*))?$/;
const CLUSTER_FORM = 'redis+cluster://[user:password@]host:port[,host:port...][/0]';

/**
 * ``redis+cluster://`` (or ``rediss+cluster://``, TLS) as delayq's Python side reads it:
 * createCluster's options, or null for a URL of another scheme. ``error`` makes the error
 * thrown for a URL that is not of the form.
 */
function clusterOptions(url, error) {
  if (!/^rediss?\+cluster:/.test(url)) return null;
  const m = CLUSTER_URL.exec(url);
  if (!m) throw error(`cluster URL ${JSON.stringify(url)} is not of the form ${CLUSTER_FORM}`);
  const [, scheme, auth, hosts, db] = m;
  if (db && db !== '0') {
    throw error(`a Redis Cluster has only database 0, but ${JSON.stringify(url)} names ${db}`);
  }
  const rootNodes = hosts.split(',').map((hostPort) => {
    const h = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(hostPort);
    if (!h || Number(h[3]) < 1 || Number(h[3]) > 65535) {
      throw error(
        `cluster URL ${JSON.stringify(url)}: ${JSON.stringify(hostPort)} is not host:port ` +
          `(the form is ${CLUSTER_FORM})`
      );
    }
    return { socket: { host: h[1] || h[2], port: Number(h[3]) } };
  });
  const defaults = {};
  if (auth) {
    const colon = auth.indexOf(':');
    const [user, password] = colon < 0 ? ['', auth] : [auth.slice(0, colon), auth.slice(colon + 1)];
    if (user) defaults.username = decodeURIComponent(user);
    if (password) defaults.password = decodeURIComponent(password);
  }
  if (scheme === 'rediss') defaults.socket = { tls: true };
  return { rootNodes, defaults };
}

function startsWithAny(err, prefixes) {
  const message = String(err && err.message);
  return prefixes.some((p) => message.startsWith(p));
}

/**
 * Send one script call (``command``: EVALSHA ...) to the primary of ``firstKey``'s slot.
 * The cluster client follows MOVED (it reads the slot map again) and ASK (ASKING, then the
 * call on the node the slot is moving to). NOSCRIPT: ``load(send)`` loads the script on the
 * slot's owner and the call is sent again; a second NOSCRIPT means another node answered
 * (ASK sent the call to the node a slot is moving to): then it is loaded on every primary.
 */
async function clusterCall(cluster, firstKey, command, load) {
  let loads = 0;
  for (let resends = 0; ; ) {
    try {
      return await cluster.sendCommand(firstKey, false, command);
    } catch (err) {
      if (startsWithAny(err, ['NOSCRIPT']) && loads < 2) {
        if (loads++ === 0) {
          await load((args) => cluster.sendCommand(firstKey, false, args));
        } else {
          await Promise.all(
            cluster.masters.map(async (node) => {
              const client = await cluster.nodeClient(node);
              return load((args) => client.sendCommand(args));
            })
          );
        }
        continue;
      }
      if (startsWithAny(err, RESEND) && resends < RESENDS) {
        await sleep(Math.min(100 * 2 ** resends++, 1000));
        continue;
      }
      throw err;
    }
  }
}

module.exports = { isCluster, clusterOptions, clusterCall, CLUSTER_FORM };
