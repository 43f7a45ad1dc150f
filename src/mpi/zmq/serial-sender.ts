/**
 * Serializes sends on one zeromq.js socket, which allows one send in flight at a time
 * (a second concurrent `send` rejects with EBUSY). The fast path — nothing in flight —
 * calls `socket.send` directly, so an idle channel pays no queueing cost.
 *
 * @example
 * const out = new SerialSender(pushSocket);
 * await Promise.all([out.send([a]), out.send([b])]); // a then b, never EBUSY
 */
import { LifelineError } from "../../errors.ts";

type Frames = readonly (Buffer | Uint8Array)[];

interface Queued {
  frames: Frames;
  resolve: () => void;
  reject: (err: unknown) => void;
}

export class SerialSender {
  private busy = false;
  private readonly queue: Queued[] = [];

  constructor(private readonly socket: { send(frames: (Buffer | Uint8Array)[]): Promise<void> }) {}

  /** Whether a send is in flight or queued. */
  get sending(): boolean {
    return this.busy;
  }

  send(frames: Frames): Promise<void> {
    if (this.busy) return new Promise((resolve, reject) => this.queue.push({ frames, resolve, reject }));
    this.busy = true;
    return this.push(frames);
  }

  private push(frames: Frames): Promise<void> {
    return this.socket.send(frames as (Buffer | Uint8Array)[]).then(
      () => this.next(),
      (err: unknown) => {
        this.next();
        throw new LifelineError("MPI_ABORTED", `send failed: ${(err as Error).message}`, { cause: err });
      },
    );
  }

  private next(): void {
    const q = this.queue.shift();
    if (q === undefined) {
      this.busy = false;
      return;
    }
    this.push(q.frames).then(q.resolve, q.reject);
  }

  /** Fails every queued (not yet started) send. */
  rejectQueued(err: unknown): void {
    for (const q of this.queue.splice(0)) q.reject(err);
  }
}
