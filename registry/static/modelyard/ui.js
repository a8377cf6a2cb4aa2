// Modelyard web UI: the little the pages need from a script. Loaded as an ES module from this origin only
// (the Content-Security-Policy forbids inline scripts). Every page works without it except the upload,
// whose streaming and progress bar are the point.

document.documentElement.classList.add("has-js");

const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
const parts = new Intl.DateTimeFormat("en-CA", {
  year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit",
  hourCycle: "h23", timeZoneName: "short",
});
// 2026-01-31 14:05:09 CET, whatever the browser's language: sortable, and the same on every page.
const stamp = {
  format(when) {
    const p = Object.fromEntries(parts.formatToParts(when).map(({ type, value }) => [type, value]));
    return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${p.timeZoneName}`;
  },
};

// Times arrive in UTC; show them in the viewer's own time zone, keeping UTC in the tooltip.
function localTimes(root = document) {
  for (const element of root.querySelectorAll("time[datetime]")) {
    const when = new Date(element.getAttribute("datetime"));
    if (Number.isNaN(when.getTime())) continue;
    element.title = element.getAttribute("datetime");
    element.textContent = stamp.format(when);
  }
  // Forms that take a time (what served at, the audit range) say which zone it is in.
  for (const input of root.querySelectorAll("input[name=tz]")) input.value = zone;
  for (const label of root.querySelectorAll("[data-zone]")) label.textContent = zone;
}

// A form button with data-confirm asks first, in a <dialog>; the form posts only after "Confirm".
function confirmations() {
  const dialog = document.getElementById("confirm");
  if (!dialog || typeof dialog.showModal !== "function") return;
  const text = dialog.querySelector("[data-message]");
  const yes = dialog.querySelector("[data-yes]");
  let pending = null;
  document.addEventListener("submit", (event) => {
    const button = event.submitter;
    const message = button?.dataset.confirm || event.target.dataset.confirm;
    if (!message || event.target.dataset.confirmed === "yes") {
      delete event.target.dataset.confirmed;
      return;
    }
    event.preventDefault();
    pending = { form: event.target, button };
    text.textContent = message;
    yes.textContent = button?.dataset.confirmLabel || "Confirm";
    yes.className = button?.classList.contains("danger") ? "danger" : "primary";
    dialog.showModal();
  });
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "yes" && pending) {
      pending.form.dataset.confirmed = "yes";
      pending.form.requestSubmit(pending.button || undefined);
    }
    pending = null;
  });
}

// A version still pending or validating: ask the API until it is decided, then show the page again.
function pollStatus() {
  const box = document.querySelector("[data-poll-url]");
  if (!box) return;
  const url = box.dataset.pollUrl;
  const badge = box.querySelector(".badge");
  const tick = async () => {
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (response.ok) {
        const { status } = await response.json();
        if (status === "ready" || status === "failed") {
          location.reload();
          return;
        }
        if (badge && status !== badge.textContent) {
          badge.textContent = status;
          badge.className = `badge ${status}`;
        }
      }
    } catch (error) {
      // The network dropped for a moment: try again on the next tick.
    }
    setTimeout(tick, 1000);
  };
  setTimeout(tick, 1000);
}

// Tables marked data-sortable: each header with data-sort ("text", "number" or "time") becomes a button that
// sorts the rows shown by that column, and the other way round on the next click. A cell may give its
// sort key in data-sort-value; a time sorts by its datetime. Equal keys keep the server's order.
function sortKey(cell, kind) {
  const value = cell.dataset.sortValue ?? cell.querySelector("time[datetime]")?.getAttribute("datetime")
    ?? cell.textContent.trim();
  if (kind === "number") {
    const number = Number.parseFloat(value);
    return Number.isNaN(number) ? Number.NEGATIVE_INFINITY : number;
  }
  if (kind === "time") {
    const when = Date.parse(value);
    return Number.isNaN(when) ? Number.NEGATIVE_INFINITY : when;
  }
  return value;
}

function sortableTables(root = document) {
  const text = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
  for (const table of root.querySelectorAll("table[data-sortable]")) {
    const body = table.tBodies[0];
    if (!body) continue;
    for (const header of table.querySelectorAll("thead th[data-sort]")) {
      const kind = header.dataset.sort;
      const button = document.createElement("button");
      button.type = "button";
      button.className = "sort";
      button.append(...header.childNodes);
      header.append(button);
      if (!header.hasAttribute("aria-sort")) header.setAttribute("aria-sort", "none");
      button.addEventListener("click", () => {
        const ascending = header.getAttribute("aria-sort") !== "ascending";
        for (const other of table.querySelectorAll("thead th[aria-sort]")) other.setAttribute("aria-sort", "none");
        header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        const column = header.cellIndex;
        // A row without the column ("No models match", spanning them all) stays where it is.
        const width = header.parentElement.cells.length;
        const rows = [...body.rows].filter((row) => row.cells.length === width);
        const keyed = rows.map((row) => [sortKey(row.cells[column], kind), row]);
        keyed.sort(([a], [b]) => {
          const order = typeof a === "number" ? a - b : text.compare(a, b);
          return ascending ? order : -order;
        });
        body.append(...keyed.map(([, row]) => row));
      });
    }
  }
}

// An element with data-copy gets a Copy button (data-copy-button names it otherwise): it copies the attribute's
// value, or the element's text when the attribute is empty. A value that starts with "/" is a path of this
// server, copied as a whole URL.
async function copyText(value) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(value);
    return;
  }
  // Plain http to another host is not a secure context, and has no clipboard API: copy from a selection.
  const area = document.createElement("textarea");
  area.value = value;
  area.setAttribute("readonly", "");
  area.className = "vh";
  document.body.append(area);
  area.select();
  const copied = document.execCommand("copy");
  area.remove();
  if (!copied) throw new Error("the browser refused to copy");
}

function copyButtons(root = document) {
  for (const element of root.querySelectorAll("[data-copy]")) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    const label = element.dataset.copyButton || "Copy";
    button.textContent = label;
    button.setAttribute("aria-label", `Copy ${element.dataset.copyLabel || "it"}`);
    button.addEventListener("click", async () => {
      const raw = element.dataset.copy || element.textContent.trim();
      const value = raw.startsWith("/") ? new URL(raw, location.origin).href : raw;
      try {
        await copyText(value);
        button.textContent = "Copied";
      } catch (error) {
        button.textContent = "Select and copy it";
      }
      setTimeout(() => { button.textContent = label; }, 2000);
    });
    element.after(button);
  }
}

// Pages whose figures move by themselves (the fleet) refresh while nobody is typing in them.
function refresh() {
  const seconds = Number(document.body.dataset.refresh || 0);
  if (!seconds) return;
  setInterval(() => {
    const active = document.activeElement;
    if (active && ["INPUT", "TEXTAREA", "SELECT"].includes(active.tagName)) return;
    if (document.querySelector("dialog[open]")) return;
    location.reload();
  }, seconds * 1000);
}

function sizeText(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

// The upload page: files dropped or chosen, the .onnx first; sent with XMLHttpRequest for its progress events.
function upload() {
  const form = document.getElementById("upload-form");
  if (!form) return;
  const drop = form.querySelector(".drop");
  const picker = form.querySelector("input[type=file]");
  const list = form.querySelector(".filelist");
  const bar = form.querySelector("progress");
  const state = form.querySelector("[data-upload-state]");
  const problem = document.getElementById("upload-error");
  const send = form.querySelector("button[type=submit]");
  let files = [];

  const show = (message, kind = "error") => {
    problem.textContent = message;
    problem.className = `flash ${kind}`;
    problem.hidden = !message;
  };
  const setFiles = (chosen) => {
    const byName = new Map(files.map((file) => [file.name, file]));
    for (const file of chosen) byName.set(file.name, file);
    files = [...byName.values()];
    const models = files.filter((file) => file.name.toLowerCase().endsWith(".onnx"));
    if (models.length === 1) files = [models[0], ...files.filter((file) => file !== models[0])];
    list.replaceChildren(...files.map((file, index) => {
      const item = document.createElement("li");
      const name = document.createElement("span");
      name.textContent = index === 0 && models.length === 1 ? `${file.name} (model)` : file.name;
      const size = document.createElement("span");
      size.className = "muted";
      size.textContent = sizeText(file.size);
      item.append(name, size);
      return item;
    }));
    show(models.length === 1 || !files.length ? "" : "Choose exactly one .onnx file; it is sent first.", "warn");
  };

  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    setFiles(event.dataTransfer.files);
  });
  picker.addEventListener("change", () => setFiles(picker.files));

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!files.length) {
      show("Drop the .onnx model (and its external-data files and extras) first.");
      return;
    }
    const body = new FormData();
    for (const file of files) body.append("file", file, file.name);
    body.append("description", form.elements.description.value);
    body.append("metadata", form.elements.metadata.value);
    const request = new XMLHttpRequest();
    request.open("POST", form.action);
    request.setRequestHeader("X-CSRFToken", form.elements.csrfmiddlewaretoken.value);
    request.setRequestHeader("Accept", "application/json");
    request.upload.addEventListener("progress", (progress) => {
      if (!progress.lengthComputable) return;
      bar.max = progress.total;
      bar.value = progress.loaded;
      state.textContent = `Sending: ${sizeText(progress.loaded)} of ${sizeText(progress.total)}`;
    });
    request.upload.addEventListener("load", () => {
      bar.value = bar.max;
      state.textContent = "Sent. The registry is checking the model…";
    });
    request.addEventListener("load", () => {
      let answer = {};
      try {
        answer = JSON.parse(request.responseText);
      } catch (error) {
        answer = { error: `the server answered ${request.status}` };
      }
      if (request.status === 201 && answer.url) {
        state.textContent = `Version ${answer.version} uploaded (${answer.status}).`;
        location.assign(answer.url);
        return;
      }
      send.disabled = false;
      bar.value = 0;
      state.textContent = "";
      show(`Refused (${request.status}): ${answer.error}`);
    });
    request.addEventListener("error", () => {
      send.disabled = false;
      state.textContent = "";
      show("The connection failed before the server answered. Try again.");
    });
    show("");
    send.disabled = true;
    bar.value = 0;
    state.textContent = "Starting…";
    request.send(body);
  });
}

localTimes();
sortableTables();
copyButtons();
confirmations();
pollStatus();
refresh();
upload();
