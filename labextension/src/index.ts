// clusterbook's JupyterLab extension: the Clusters sidebar, its log panels and its
// resources pane, over the clusters API of clusterbook_widgets.lab.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, showDialog, Dialog } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';

import { ICluster } from './api';
import { LogPanel } from './logs';
import { ResourcePanel } from './resources';
import { ClusterSidebar } from './sidebar';
import iconSvg from '../style/icon.svg';

export const clusterbookIcon = new LabIcon({ name: 'clusterbook:clusters', svgstr: iconSvg });

const IMPORT = 'import clusterbook as cb';

/** The code that attaches to a cluster, with the import when the notebook lacks it. */
export function attachCode(clusterId: string, sources: string[]): string {
  const imported = sources.some(s => /^\s*import clusterbook as cb\s*$/m.test(s));
  const attach = `cluster = cb.Cluster.attach(${JSON.stringify(clusterId)})\ncluster`;
  return imported ? attach : `${IMPORT}\n\n${attach}`;
}

function insertAttach(tracker: INotebookTracker | null, app: JupyterFrontEnd, cluster: ICluster): void {
  const panel: NotebookPanel | null = tracker?.currentWidget ?? null;
  const notebook = panel?.content;
  const model = notebook?.model;
  if (!panel || !notebook || !model) {
    void showDialog({
      title: 'No notebook',
      body: `Open a notebook to attach to ${cluster.id} from.`,
      buttons: [Dialog.okButton()]
    });
    return;
  }
  const sources: string[] = [];
  for (const cell of model.sharedModel.cells) {
    sources.push(cell.getSource());
  }
  const index = Math.min(notebook.activeCellIndex + 1, model.sharedModel.cells.length);
  model.sharedModel.insertCell(index, { cell_type: 'code', source: attachCode(cluster.id, sources) });
  notebook.activeCellIndex = index;
  app.shell.activateById(panel.id);
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'clusterbook-labextension:plugin',
  description: "The Clusters sidebar: every cluster of the user, with Attach, Stop, Logs, New and a resources pane.",
  autoStart: true,
  optional: [INotebookTracker, ICommandPalette],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker | null, palette: ICommandPalette | null) => {
    const open = (widget: LogPanel | ResourcePanel): void => {
      const existing = [...app.shell.widgets('main')].find(w => w.id === `${widget.id}-area`);
      if (existing) {
        app.shell.activateById(existing.id);
        widget.dispose();
        return;
      }
      const area = new MainAreaWidget({ content: widget });
      area.id = `${widget.id}-area`;
      area.title.label = widget.title.label;
      area.title.icon = clusterbookIcon;
      area.title.closable = true;
      widget.title.changed.connect(() => (area.title.label = widget.title.label));
      app.shell.add(area, 'main');
      app.shell.activateById(area.id);
    };
    const sidebar = new ClusterSidebar({
      attach: cluster => insertAttach(tracker, app, cluster),
      logs: cluster => open(new LogPanel(cluster.id, null)),
      resources: cluster => open(new ResourcePanel(cluster.id))
    });
    sidebar.title.icon = clusterbookIcon;
    app.shell.add(sidebar, 'left', { rank: 250 });
    app.commands.addCommand('clusterbook:show-clusters', {
      label: 'Show Clusters',
      caption: 'The clusters of this user (clusterbook)',
      execute: () => app.shell.activateById(sidebar.id)
    });
    palette?.addItem({ command: 'clusterbook:show-clusters', category: 'clusterbook' });
  }
};

export default plugin;
