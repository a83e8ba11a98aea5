// Opening the trace in the Perfetto UI by postMessage (the handshake the UI documents): open
// the UI's window, post 'PING' every 100 ms until the UI answers 'PONG', then post
// {perfetto: {buffer, title, fileName}}. Unlike the `url=` deep link this works whatever port
// phantora view listens on.

export const PERFETTO_UI_ORIGIN = 'https://ui.perfetto.dev';

/**
 * The UI origin to talk to: ui.perfetto.dev, or, for tests only, a stand-in on this machine given
 * as ?perfetto_origin=http://127.0.0.1:PORT. Any other value is refused, so a crafted link to the
 * dashboard cannot send the trace to another site.
 */
export function perfettoOrigin(search) {
  const asked = new URLSearchParams(search).get('perfetto_origin');
  if (asked === null) return PERFETTO_UI_ORIGIN;
  let url;
  try {
    url = new URL(asked);
  } catch {
    throw new Error(`perfetto_origin=${asked} is not a URL`);
  }
  const local = url.protocol === 'http:' && (url.hostname === '127.0.0.1' || url.hostname === 'localhost');
  if (!local) throw new Error(`perfetto_origin must be http://127.0.0.1:PORT (a local stand-in), not ${asked}`);
  return url.origin;
}

/**
 * Must be called from a click handler: browsers allow window.open only there.
 * Resolves once the trace has been posted; rejects if the UI never answers.
 */
export async function openInPerfetto({ origin, traceUrl, title, fileName, onStatus = () => {}, timeoutMs = 30000 }) {
  const ui = window.open(`${origin}/#!/`, '_blank');
  if (!ui) throw new Error('the browser blocked the new window: allow pop-ups for this page');
  onStatus(`Waiting for ${origin} to load…`);
  const trace = fetch(traceUrl).then((r) => {
    if (!r.ok) throw new Error(`fetching the trace failed: HTTP ${r.status}`);
    return r.arrayBuffer();
  });
  await new Promise((resolve, reject) => {
    // Posts before the UI has loaded go to a window of another origin and are dropped, which is
    // why the PING repeats.
    const ping = setInterval(() => ui.postMessage('PING', origin), 100);
    const giveUp = setTimeout(() => {
      done();
      reject(new Error(`${origin} did not answer within ${timeoutMs / 1000} s`));
    }, timeoutMs);
    function onMessage(ev) {
      if (ev.source !== ui || ev.origin !== origin || ev.data !== 'PONG') return;
      done();
      resolve();
    }
    function done() {
      clearInterval(ping);
      clearTimeout(giveUp);
      window.removeEventListener('message', onMessage);
    }
    window.addEventListener('message', onMessage);
  });
  const buffer = await trace;
  const size = buffer.byteLength; // read before the transfer below empties `buffer`
  onStatus(`Sending ${(size / 1e6).toFixed(1)} MB to ${origin}…`);
  // Transferred, not copied: traces can be hundreds of MB.
  ui.postMessage({ perfetto: { buffer, title, fileName } }, origin, [buffer]);
  return size;
}
