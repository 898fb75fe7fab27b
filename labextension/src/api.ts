// The clusters API of clusterbook's Jupyter Server extension (clusterbook_widgets.lab).
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** A cluster as `GET clusters` lists it (what `clusterbook ls` shows). */
export interface ICluster {
  id: string;
  name: string | null;
  kind: string | null;
  state: string;
  running: boolean;
  nodes: number | null;
  nodes_ready: number;
  slots: number | null;
  jobs: number | null;
  running_jobs: number | null;
  created: number | null;
  started: number | null;
  stopped: number | null;
  time_left: number | null;
  time_left_text: string | null;
  directory: string;
  problem: string | null;
}

/** A job as `GET clusters/ID/jobs` lists it. */
export interface IJob {
  id: string;
  state: string;
  np: number;
  argv: string[];
  label: string | null;
}

/** A log line with its position. */
export interface ILine {
  position: number;
  time: number;
  rank: number;
  host: string;
  stream: string;
  text: string;
}

export interface ILogPage {
  lines: ILine[];
  next: number;
  missed: number;
  ended: boolean;
}

/** The head's resource history of each node. */
export interface IHistory {
  interval: number;
  nodes: {
    [node: string]: {
      t: number[];
      cpu: (number | null)[];
      memory_used_gib: (number | null)[];
      memory_gib: number | null;
      gpu: (number | null)[];
    };
  };
}

export interface IProfiles {
  path: string;
  exists: boolean;
  profiles: { name: string; kind: string }[];
}

/** An answer of the API that is not a success: its message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

/** Call the API at `path` (under /clusterbook/api/); its JSON answer. */
export async function requestAPI<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'clusterbook', 'api', path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { message: text };
  }
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.message) || response.statusText);
  }
  return data as T;
}
