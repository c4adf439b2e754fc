// An async iterator over notifications: pushed by the client as messages
// are read, pulled by `for await`; ended by the client's close, the
// caller's signal, or a break out of the loop.

export class NotificationQueue<T> implements AsyncIterableIterator<T> {
  private readonly items: T[] = [];
  private readonly waiters: ((r: IteratorResult<T>) => void)[] = [];
  private ended = false;

  constructor(private readonly onEnd: () => void) {}

  push(item: T): void {
    if (this.ended) return;
    const w = this.waiters.shift();
    if (w) w({ value: item, done: false });
    else this.items.push(item);
  }

  /** No more items: waiting readers finish, buffered items still come. */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.onEnd();
    for (const w of this.waiters.splice(0)) w({ value: undefined, done: true });
  }

  next(): Promise<IteratorResult<T>> {
    const item = this.items.shift();
    if (item !== undefined) return Promise.resolve({ value: item, done: false });
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  return(): Promise<IteratorResult<T>> {
    this.items.length = 0;
    this.end();
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<T> {
    return this;
  }
}
