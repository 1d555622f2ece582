// Why this exists: callbacks are the application's code. One that throws must not end the
// session (it would look like a protocol error) or keep the other callbacks from running; its
// error goes to `ClientOptions.onCallbackError`, by default thrown again on its own, after
// them, as an uncaught error (the browser's console, Node's `uncaughtException`).

export type Report = (error: unknown) => void;

/** The default report: throw it again, outside the session's code. */
export const rethrowLater: Report = (error) =>
  queueMicrotask(() => {
    throw error;
  });

export function emit<A extends unknown[]>(report: Report, listeners: Iterable<(...args: A) => void>, ...args: A): void {
  for (const l of listeners) call(report, l, ...args);
}

/** Calls one callback the same way. */
export function call<A extends unknown[]>(report: Report, fn: (...args: A) => void, ...args: A): void {
  try {
    fn(...args);
  } catch (e) {
    report(e);
  }
}
