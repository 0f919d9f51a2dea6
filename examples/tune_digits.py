"""A training function to tune: a small PyTorch MLP on scikit-learn's digits.

``sparkml-dist tune --conf conf/tune_example.yaml`` loads ``train`` from this file and ships it to
the trials by value: executors need only torch and scikit-learn, not this file.
"""


def train(params, trial):
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    torch.manual_seed(params.get("seed", 0))
    torch.set_num_threads(1)  # one core per trial: trials run side by side
    X, y = load_digits(return_X_y=True)
    X_tr, X_va, y_tr, y_va = train_test_split(X / 16.0, y, test_size=0.25, random_state=0)
    X_tr, X_va = (torch.tensor(a, dtype=torch.float32) for a in (X_tr, X_va))
    y_tr, y_va = (torch.tensor(a) for a in (y_tr, y_va))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, params["hidden"]), torch.nn.ReLU(), torch.nn.Linear(params["hidden"], 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(params["epochs"]):
        model.train()
        for idx in torch.randperm(len(X_tr)).split(params.get("batch", 64)):
            opt.zero_grad()
            loss_fn(model(X_tr[idx]), y_tr[idx]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            logits = model(X_va)
            val_loss = float(loss_fn(logits, y_va))
            accuracy = float((logits.argmax(1) == y_va).float().mean())
        trial.report(epoch, val_loss=val_loss, accuracy=accuracy)
        if trial.should_stop():
            break
    return {
        "val_loss": val_loss,
        "accuracy": accuracy,
        "epochs_run": epoch + 1,
    }
