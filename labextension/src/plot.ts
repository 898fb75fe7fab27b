// Small SVG plots of a series over time (pure: values in, SVG out), and the cluster's sum.

export const SVG_NS = 'http://www.w3.org/2000/svg';

/** A series: times (unix seconds) and values (null: not known then). */
export interface ISeries {
  t: number[];
  v: (number | null)[];
}

/** The points of a polyline of `series` in a `width` x `height` box, the values from 0 to
 * `max` and the times over `[start, end]`; gaps (null) split it into pieces. */
export function pieces(series: ISeries, max: number, start: number, end: number, width: number, height: number): string[] {
  const span = Math.max(end - start, 1e-9);
  const top = max > 0 ? max : 1;
  const out: string[] = [];
  let current: string[] = [];
  for (let i = 0; i < series.t.length; i++) {
    const value = series.v[i];
    if (value === null || value === undefined || !isFinite(value)) {
      if (current.length) {
        out.push(current.join(' '));
      }
      current = [];
      continue;
    }
    const x = ((series.t[i] - start) / span) * width;
    const y = height - (Math.min(Math.max(value, 0), top) / top) * height;
    current.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  }
  if (current.length) {
    out.push(current.join(' '));
  }
  return out;
}

/** An SVG element drawing `series` (see `pieces`), with its last value as a title. */
export function sparkline(series: ISeries, max: number, start: number, end: number, label: string, unit: string, width = 160, height = 36): SVGSVGElement {
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('class', 'cb-Plot');
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('role', 'img');
  const last = [...series.v].reverse().find(v => v !== null && v !== undefined);
  const said = last === undefined || last === null ? 'no data' : `${last.toFixed(1)} ${unit}`;
  svg.setAttribute('aria-label', `${label}: ${said}`);
  const frame = document.createElementNS(SVG_NS, 'rect');
  frame.setAttribute('class', 'cb-Plot-frame');
  frame.setAttribute('x', '0');
  frame.setAttribute('y', '0');
  frame.setAttribute('width', String(width));
  frame.setAttribute('height', String(height));
  svg.appendChild(frame);
  for (const points of pieces(series, max, start, end, width, height)) {
    const line = document.createElementNS(SVG_NS, 'polyline');
    line.setAttribute('class', 'cb-Plot-line');
    line.setAttribute('points', points);
    svg.appendChild(line);
  }
  const value = document.createElementNS(SVG_NS, 'text');
  value.setAttribute('class', 'cb-Plot-value');
  value.setAttribute('x', '3');
  value.setAttribute('y', '11');
  value.textContent = said;
  svg.appendChild(value);
  const title = document.createElementNS(SVG_NS, 'title');
  title.textContent = `${label}: ${said}`;
  svg.appendChild(title);
  return svg;
}

/** The sum over nodes, time by time (times rounded to the interval, so the nodes' reports of
 * one moment add up); `mean` divides by the nodes that reported then. */
export function combine(all: ISeries[], interval: number, mean: boolean): ISeries {
  const step = interval > 0 ? interval : 1;
  const sums = new Map<number, { sum: number; n: number }>();
  for (const series of all) {
    for (let i = 0; i < series.t.length; i++) {
      const value = series.v[i];
      if (value === null || value === undefined || !isFinite(value)) {
        continue;
      }
      const key = Math.round(series.t[i] / step);
      const got = sums.get(key) ?? { sum: 0, n: 0 };
      got.sum += value;
      got.n += 1;
      sums.set(key, got);
    }
  }
  const keys = [...sums.keys()].sort((a, b) => a - b);
  return {
    t: keys.map(k => k * step),
    v: keys.map(k => {
      const got = sums.get(k)!;
      return mean ? got.sum / got.n : got.sum;
    })
  };
}
